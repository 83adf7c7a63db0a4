"""Why aiokafka could not connect. When no bootstrap server answers, aiokafka raises a bare
``KafkaConnectionError: Unable to bootstrap from [...]`` and only *logs* each server's cause
(refused, SASL authentication failed, certificate verify failed...). This captures those log
records while a client starts, so the error rowbatch raises can name the cause."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

_LOGGER = "aiokafka"
_PREFIX = "Unable connect to "


class ConnectCauses(logging.Handler):
    """Collects aiokafka's "Unable connect to <server>: <cause>" records for ``servers``."""

    def __init__(self, servers: Sequence[str]) -> None:
        super().__init__(logging.ERROR)
        self._servers = [s.strip() for s in servers if s.strip()]
        self.causes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not message.startswith(_PREFIX):
            return
        target, _, cause = message[len(_PREFIX) :].partition(": ")
        if any(server in target for server in self._servers) and cause not in self.causes:
            self.causes.append(cause)

    def describe(self) -> str:
        """``"; cause: <first>, <second>"`` or empty."""
        return f"; cause: {' | '.join(self.causes)}" if self.causes else ""


@contextlib.contextmanager
def connect_causes(bootstrap_servers: str) -> Iterator[ConnectCauses]:
    """While the block runs, note why aiokafka could not connect to these servers."""
    handler = ConnectCauses(bootstrap_servers.split(","))
    logger = logging.getLogger(_LOGGER)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
