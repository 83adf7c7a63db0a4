"""Deprecated alias of :mod:`wire.headers` (the wire contract moved to the shared package
``wire``). ``import producer.headers`` still works, gives the same module object, and warns."""

import sys
import warnings

import wire.headers

warnings.warn(
    "producer.headers moved to wire.headers; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = wire.headers
