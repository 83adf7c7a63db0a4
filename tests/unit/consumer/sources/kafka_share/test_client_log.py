"""librdkafka's lines are thinned to one per kind a minute, with the count held back."""

from __future__ import annotations

import logging

from rowbatch.consumer.sources.kafka_share.client_log import Thinned


def line(fac: str, text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("c", level, __file__, 1, "%s [%s] %s", (fac, "c#1", text), None)


def test_one_line_per_kind_a_minute_with_the_count_held_back() -> None:
    now = [0.0]
    thinned = Thinned(60.0, clock=lambda: now[0])
    assert thinned.filter(line("FAIL", "refused"))
    kept = [thinned.filter(line("FAIL", "refused")) for _ in range(40)]
    assert not any(kept)
    assert thinned.filter(line("SHARECONSUMER", "Preview"))  # another kind passes
    assert thinned.filter(line("FAIL", "refused", logging.WARNING))  # another level too
    now[0] = 61.0
    record = line("FAIL", "refused again")
    assert thinned.filter(record)
    assert record.getMessage() == "FAIL [c#1] refused again (40 like it held back)"
