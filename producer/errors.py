"""Deprecated alias of :mod:`wire.errors` (the wire contract moved to the shared package
``wire``). ``import producer.errors`` still works, gives the same module object, and warns."""

import sys
import warnings

import wire.errors

warnings.warn(
    "producer.errors moved to wire.errors; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = wire.errors
