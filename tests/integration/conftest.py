"""Fixtures shared by the integration tests (the services themselves are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.pubsub import PubSubEndpoint
from tests.integration.consumer_helpers import Topics


@pytest.fixture
def topics(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topics]:
    """A fresh topic with its subscription and a dead-letter topic on the emulator; the
    emulator's address is in the environment for clients built in this process."""
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    t = Topics.create(pubsub)
    yield t
    t.close()
