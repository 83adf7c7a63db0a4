"""rowbatch consumer: the subscriber service (grows in later issues)."""
