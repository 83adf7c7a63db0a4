"""rowbatch producer: the wire contract and the publishing side."""
