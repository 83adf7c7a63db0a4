"""The broker- and model-independent core: intake (decode and check a delivery), the
batcher, the byte budget, the ledger of what is in flight, poison isolation, the pipeline that
runs inference workers, and the writer stage that commits results before acking."""
