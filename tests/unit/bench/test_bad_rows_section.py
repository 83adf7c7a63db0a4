"""The ``bad_rows`` section's table and targets: each bad run is compared with its broker's
clean run, model-rejected rows per isolation and input-checked rows apart."""

from __future__ import annotations

from bench.bad_rows import BadRowsResult, BadRowsRun, _chunk
from bench.stack import Broker
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk


def run(broker: Broker, cause: str, isolation: str, bad: int, rows_per_s: float) -> BadRowsRun:
    return BadRowsRun(broker, isolation, cause, bad, 1000, rows_per_s, 10, 20.0, bad, 0)


def test_each_cause_is_compared_with_the_clean_run() -> None:
    result = BadRowsResult(
        (
            run("kafka", "model", "serial", 0, 1000.0),
            run("kafka", "model", "serial", 1, 250.0),
            run("kafka", "model", "concurrent", 1, 500.0),
            run("kafka", "input", "serial", 1, 980.0),
        )
    )
    assert result.ratio("kafka", "serial", "model") == 0.25
    assert result.ratio("kafka", "serial", "input") == 0.98
    targets = {t.name: (t.got, t.met) for t in result.targets()}
    assert targets == {
        "bad rows kafka (serial isolation): 0.1 % bad rows vs clean, rows/s": ("0.25x", False),
        "bad rows kafka (concurrent isolation): 0.1 % bad rows vs clean, rows/s": ("0.50x", False),
        "bad rows kafka (input checks): 0.1 % bad rows vs clean, rows/s": ("0.98x", True),
    }
    rows = result.table().rows
    assert [r[1] for r in rows] == ["-", "model", "model", "input"]
    assert [r[6] for r in rows] == ["1", "0.25x", "0.50x", "0.98x"]


def test_a_bad_input_row_is_a_null_and_a_model_row_is_marked() -> None:
    null = decode_chunk(*_payload(_chunk(1, "input", "p")))
    assert null.null_masks["text"].sum() == 1
    marked = decode_chunk(*_payload(_chunk(1, "model", "p")))
    assert sum("POISON-ROW" in t for t in marked.columns["text"]) == 1
    clean = decode_chunk(*_payload(_chunk(1, None, "p")))
    assert not clean.null_masks and not any("POISON" in t for t in clean.columns["text"])


def _payload(chunk: EncodedChunk) -> tuple[bytes, dict[str, str]]:
    return chunk.payload, dict(chunk.attributes)
