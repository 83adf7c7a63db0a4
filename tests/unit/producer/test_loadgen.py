"""The load generator: deterministic tables, an exact and documented set of malformed messages,
pacing to a rate with an injected clock (no sleeping), and the manifest tests rely on."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from rowbatch.producer.cli.main import main
from rowbatch.producer.loadgen.malformed import expected_reason, plan_malformed
from rowbatch.producer.loadgen.plan import plan_messages
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.spec import DECODE_KINDS, LoadKind, LoadSpec, MalformedKind
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.columns.column_type import INT64, STRING, ColumnType
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PRODUCED_AT, H_ROW_COUNT, Encoding
from tests.unit.producer.publish_fakes import FakePublisher, reassemble
from tests.virtual_time import VirtualTime

BROKER = ["--broker", "kafka", "--bootstrap", "fake:9092", "--topic", "load"]


def _payloads(spec: LoadSpec) -> list[tuple[bytes, dict[str, str]]]:
    out = []
    for planned in plan_messages(spec, max_chunk_bytes=10_000_000):
        attrs = dict(planned.message.attributes)
        attrs.pop(H_PRODUCED_AT, None)
        out.append((planned.message.payload, attrs))
    return out


@pytest.mark.parametrize("encoding", ["json", "arrow"])
@pytest.mark.parametrize("kind", ["text", "numeric"])
def test_the_same_seed_gives_the_same_messages(encoding: str, kind: LoadKind) -> None:
    spec = LoadSpec(rows=2500, chunk_rows=1000, kind=kind, encoding=Encoding.parse(encoding))
    assert _payloads(spec) == _payloads(spec)
    other = LoadSpec(
        rows=2500,
        chunk_rows=1000,
        kind=kind,
        encoding=Encoding.parse(encoding),
        seed=1,
    )
    assert _payloads(spec) != _payloads(other)


def test_text_table_shape() -> None:
    spec = LoadSpec(rows=2500, chunk_rows=1000, width=20, encoding=Encoding.JSON, id_prefix="t")
    messages = list(plan_messages(spec, max_chunk_bytes=10_000_000))
    assert [m.chunk_id for m in messages] == ["t:0", "t:1", "t:2"]
    assert [m.rows for m in messages] == [1000, 1000, 500]
    chunk = decode_chunk(messages[2].message.payload, messages[2].message.attributes)
    assert dict(chunk.types) == {"id": INT64, "text": STRING}
    assert chunk.columns["id"].tolist() == list(range(2000, 2500))
    assert {len(t) for t in chunk.columns["text"]} == {20}
    assert spec.schema() == {"id": INT64, "text": STRING}


def test_numeric_table_matches_the_scorer_model() -> None:
    spec = LoadSpec(rows=300, chunk_rows=1000, kind="numeric")
    (message,) = plan_messages(spec, max_chunk_bytes=10_000_000)
    chunk = decode_chunk(message.message.payload, message.message.attributes)
    assert dict(chunk.types) == {"id": INT64, "features": ColumnType.vector(16), "count": INT64}
    assert chunk.columns["features"].shape == (300, 16)
    assert chunk.columns["count"].min() >= 0


def test_plan_malformed_is_exact_and_covers_every_kind() -> None:
    spec = LoadSpec(rows=100_000, chunk_rows=1000, malformed=0.08, reject_marker="BOOM")
    plan = plan_malformed(spec)
    assert len(plan) == 8
    assert sorted(plan.values()) == sorted(list(DECODE_KINDS) * 2)
    assert plan == plan_malformed(spec)
    tiny = LoadSpec(rows=10_000, chunk_rows=1000, malformed=0.001)
    assert len(plan_malformed(tiny)) == 1  # a fraction above 0 gives at least one
    assert plan_malformed(LoadSpec(rows=10_000)) == {}


@pytest.mark.parametrize("encoding", [Encoding.JSON, Encoding.ARROW])
@pytest.mark.parametrize("kind", ["text", "numeric"])
def test_every_malformed_message_fails_as_documented(encoding: Encoding, kind: LoadKind) -> None:
    kinds = tuple(MalformedKind) if kind == "text" else DECODE_KINDS
    spec = LoadSpec(
        rows=20_000,
        chunk_rows=500,
        kind=kind,
        encoding=encoding,
        malformed=0.25,
        malformed_kinds=kinds,
        reject_marker="REJECT-ME" if kind == "text" else None,
        id_prefix="m",
    )
    seen: set[MalformedKind] = set()
    for planned in plan_messages(spec, max_chunk_bytes=10_000_000):
        message = planned.message
        if planned.kind is None:
            decode_chunk(message.payload, message.attributes, schema=spec.schema())
            continue
        seen.add(planned.kind)
        assert message.attributes[H_CHUNK_ID] == planned.chunk_id
        reason = expected_reason(planned.kind, encoding)
        if reason is None:  # reject-marker: valid, but one row carries the marker
            chunk = decode_chunk(message.payload, message.attributes, schema=spec.schema())
            marked = [t for t in chunk.columns["text"] if "REJECT-ME" in t]
            assert len(marked) == 1
            row = int(np.flatnonzero(chunk.columns["text"] == marked[0])[0])
            assert int(chunk.columns["id"][row]) == planned.marker_id
            continue
        assert planned.reason == reason
        with pytest.raises(WireError) as info:
            decode_chunk(message.payload, message.attributes, schema=spec.schema())
        assert info.value.reason == reason
        if not (planned.kind is MalformedKind.WRONG_TYPE and encoding is Encoding.ARROW):
            with pytest.raises(WireError):  # caught without an expected schema too
                decode_chunk(message.payload, message.attributes)
    assert seen == set(kinds)


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="reject-marker needs --kind text"):
        LoadSpec(
            rows=10,
            kind="numeric",
            malformed=0.5,
            malformed_kinds=(MalformedKind.REJECT_MARKER,),
        )
    with pytest.raises(ValueError, match="fraction"):
        LoadSpec(rows=10, malformed=1.5)
    with pytest.raises(ValueError, match="must not be empty"):
        LoadSpec(rows=10, reject_marker="")
    default = LoadSpec(rows=10, malformed=0.5, malformed_kinds=(MalformedKind.REJECT_MARKER,))
    assert default.reject_marker == "rowbatch-reject-me"


async def test_rate_limiter_paces_rows() -> None:
    time = VirtualTime()
    limiter = RateLimiter(100.0, clock=time.clock, sleep=time.sleep)
    for _ in range(5):
        await limiter.acquire(50)
    assert time.now - 1000.0 == pytest.approx(2.0)  # 250 rows at 100/s: the 5th waits 2 s
    unlimited = RateLimiter(None, clock=time.clock, sleep=time.sleep)
    before = len(time.slept)
    for _ in range(5):
        await unlimited.acquire(10_000)
    assert len(time.slept) == before
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(0)


async def test_rate_limiter_does_not_burst_after_falling_behind() -> None:
    time = VirtualTime()
    limiter = RateLimiter(100.0, clock=time.clock, sleep=time.sleep)
    await limiter.acquire(100)
    time.now += 10.0  # the publisher stalled for 10 s
    await limiter.acquire(100)
    await limiter.acquire(100)
    assert time.slept[-1] == pytest.approx(1.0)


def test_loadgen_cli_at_a_rate_with_a_manifest(tmp_path: Path) -> None:
    time = VirtualTime()
    publisher = FakePublisher()
    out, err = io.StringIO(), io.StringIO()
    manifest_path = tmp_path / "sent.json"
    code = main(
        [
            "loadgen",
            *BROKER,
            "--rows",
            "10000",
            "--chunk-rows",
            "500",
            "--rate",
            "2000",
            "--malformed",
            "0.2",
            "--malformed-kinds",
            "bad-encoding,row-count,reject-marker",
            "--reject-marker",
            "POISON",
            "--encoding",
            "json",
            "--id-prefix",
            "lg",
            "--manifest",
            str(manifest_path),
        ],
        publisher_factory=lambda _opts: publisher,
        stdout=out,
        stderr=err,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert code == 0, err.getvalue()
    # 20 chunks of 500 rows at 2000 rows/s: the last goes out after 19 * 0.25 s.
    assert sum(time.slept) == pytest.approx(4.75)
    manifest = json.loads(manifest_path.read_text())
    malformed = manifest["malformed"]
    assert len(malformed) == 4
    assert {m["kind"] for m in malformed.values()} == {"bad-encoding", "row-count", "reject-marker"}
    assert manifest["rows"] == 10_000 and manifest["messages"] == 20
    assert manifest["valid_rows"] == 10_000 - 500 * len(malformed)
    assert manifest["summary"]["rows"] == 10_000
    assert manifest["summary"]["seconds"] == pytest.approx(4.75)
    assert manifest["schema"] == {"id": "int64", "text": "string"}
    # The manifest's set is exactly the set of messages that are not plain valid chunks.
    bad = set()
    for sent in publisher.sent:
        try:
            chunk = decode_chunk(sent.payload, sent.attributes)
        except WireError as exc:
            assert malformed[sent.attributes[H_CHUNK_ID]]["reason"] == exc.reason
            bad.add(sent.attributes[H_CHUNK_ID])
            continue
        if any("POISON" in t for t in chunk.columns["text"]):
            bad.add(chunk.chunk_id)
    assert bad == set(malformed)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("published: 10,000 rows, 20 chunks")
    assert lines[1].startswith("malformed: 4 of 20 messages: ")
    assert all(chunk_id in lines[1] for chunk_id in malformed)


def test_loadgen_valid_rows_are_all_there() -> None:
    publisher = FakePublisher()
    code = main(
        ["loadgen", *BROKER, "--rows", "3210", "--chunk-rows", "1000", "--kind", "numeric"],
        publisher_factory=lambda _opts: publisher,
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert code == 0
    got = reassemble((s.payload, s.attributes) for s in publisher.sent)
    assert got["id"][0].tolist() == list(range(3210))
    assert got["features"][0].shape == (3210, 16)
    assert all(s.attributes[H_ROW_COUNT] in {"1000", "210"} for s in publisher.sent)
    assert publisher.sent[0].attributes[H_CHUNK_ID].startswith("lg-")


def test_loadgen_usage_errors() -> None:
    err = io.StringIO()
    code = main(
        [
            "loadgen",
            *BROKER,
            "--kind",
            "numeric",
            "--malformed",
            "0.1",
            "--malformed-kinds",
            "reject-marker",
        ],
        publisher_factory=lambda _opts: FakePublisher(),
        stdout=io.StringIO(),
        stderr=err,
    )
    assert code == 2 and "reject-marker needs --kind text" in err.getvalue()
    with pytest.raises(SystemExit):
        main(["loadgen", *BROKER, "--malformed-kinds", "typo"], stderr=io.StringIO())
    with pytest.raises(SystemExit):
        main(["loadgen", *BROKER, "--rate", "fast"], stderr=io.StringIO())
