"""Fixtures shared by the integration tests (the services themselves are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.pubsub import PubSubEndpoint
from tests.integration.consumer_helpers import Topics
from tests.integration.pubsub_helpers import use_emulator


@pytest.fixture
def topics(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topics]:
    """A fresh topic with its subscription and a dead-letter topic on the emulator; the
    emulator's address is in the environment for clients built in this process."""
    use_emulator(pubsub, monkeypatch)
    t = Topics.create(pubsub)
    yield t
    t.close()
