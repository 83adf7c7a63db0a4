"""Deprecated alias of :mod:`wire.codec_json` (the wire contract moved to the shared package
``wire``). ``import producer.codec_json`` still works, gives the same module object, and warns."""

import sys
import warnings

import wire.codec_json

warnings.warn(
    "producer.codec_json moved to wire.codec_json; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = wire.codec_json
