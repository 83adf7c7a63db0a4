"""The broker- and model-independent core: intake (decode and check a delivery), the batcher,
the byte budget, the ledger of what is in flight, poison isolation, and the pipeline with its
stages (intake, inference workers, writers) and the settling that acks only written rows."""
