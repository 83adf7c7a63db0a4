"""The wire contract's public API at its original import path (``producer.wire``); it lives
in the shared package :mod:`wire` (``wire.chunks``). Both paths name the same objects and stay
supported."""

from wire.chunks import *  # noqa: F403
from wire.chunks import __all__ as __all__  # noqa: PLC0414
