"""Deprecated alias of :mod:`wire.codec_arrow` (the wire contract moved to the shared package
``wire``). ``import producer.codec_arrow`` still works, gives the same module object, and warns."""

import sys
import warnings

import wire.codec_arrow

warnings.warn(
    "producer.codec_arrow moved to wire.codec_arrow; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = wire.codec_arrow
