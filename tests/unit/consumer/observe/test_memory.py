"""rowbatch.consumer.observe.memory.dump_traced: the allocation sites a consumer writes on
SIGUSR1 while tracemalloc traces (docs/memory.md, "Finding where the bytes are")."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from rowbatch.consumer.observe.memory import dump_traced


def test_nothing_is_written_unless_tracing(tmp_path: Path) -> None:
    assert not tracemalloc.is_tracing()
    assert dump_traced(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_the_dump_names_the_line_that_holds_the_bytes(tmp_path: Path) -> None:
    tracemalloc.start(5)
    try:
        held = [bytearray(1024) for _ in range(2000)]  # the site to find: ~2 MB
        path = dump_traced(tmp_path, top=5, clock=lambda: 1.5)
    finally:
        tracemalloc.stop()
    assert path is not None and path.parent == tmp_path
    assert path.name.endswith("-1500.txt")
    text = path.read_text()
    first_site = text.split("\n", 2)[1:]
    size = int(first_site[0].split()[0].replace(",", ""))
    assert size >= 2000 * 1024, text[:500]
    assert f"{Path(__file__).name}" in first_site[1].split("\n")[0], text[:800]
    assert "held = [bytearray(1024)" in text
    assert len(held) == 2000
