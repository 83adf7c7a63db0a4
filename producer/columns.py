"""Deprecated alias of :mod:`wire.columns` (the wire contract moved to the shared package
``wire``). ``import producer.columns`` still works, gives the same module object, and warns."""

import sys
import warnings

import wire.columns

warnings.warn(
    "producer.columns moved to wire.columns; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = wire.columns
