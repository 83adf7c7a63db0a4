"""rowbatch consumer: the subscriber service (grows in later issues)."""

__version__ = "0.1.0"
