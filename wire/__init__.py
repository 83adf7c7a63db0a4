"""The row-chunk wire contract, shared by the publishing side (``producer``) and the
subscriber (``consumer``): message headers, column types, the JSON and Arrow codecs, the
errors that name a broken contract, and the dead-letter attributes. The contract in prose is
``docs/wire-format.md``; the whole public API is re-exported here."""

from rowbatch.wire.chunks import *  # noqa: F403
from rowbatch.wire.chunks import __all__ as _chunk_names

__all__ = list(_chunk_names)
