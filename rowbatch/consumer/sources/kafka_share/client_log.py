"""The share-group source's librdkafka log, through Python's logging (confluent-kafka's
``logger`` setting) and thinned: while a broker is down the client logs each failed connection
attempt, dozens a second, so each kind of line (librdkafka's facility and level) passes at
most once per :data:`EVERY_S`, with the count of those held back meanwhile."""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from rowbatch.timing import Clock

EVERY_S: Final = 60.0
LOGGER_NAME: Final = "rowbatch.kafka_share.client"


class Thinned(logging.Filter):
    """Lets the first line of each (facility, level) through, then one per ``every_s`` with
    ``(N like it held back)`` appended."""

    def __init__(self, every_s: float = EVERY_S, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self._every_s = every_s
        self._clock = clock
        self._seen: dict[tuple[str, int], tuple[float, int]] = {}
        self._lock = threading.Lock()  # librdkafka logs from each client's thread

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        kind = (str(args[0]) if args else record.getMessage()[:40], record.levelno)
        now = self._clock()
        with self._lock:
            last, held = self._seen.get(kind, (None, 0))
            if last is not None and now - last < self._every_s:
                self._seen[kind] = (last, held + 1)
                return False
            self._seen[kind] = (now, 0)
        if held:
            record.msg = f"{record.msg} (%d like it held back)"
            record.args = (*args, held)
        return True


def client_logger() -> logging.Logger:
    """The logger given to the source's librdkafka clients (made once per process)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, Thinned) for f in logger.filters):
        logger.addFilter(Thinned())
    return logger
