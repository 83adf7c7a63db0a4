"""The ``per_message`` bench section (issue 24's CPU targets) and the py-spy stage attribution
it reports: samples of the installed package (``rowbatch/consumer/...``, links to the
top-level folders) land in their stage, not in "other"."""

from __future__ import annotations

import pytest

from bench import cli
from bench.per_message import Drained, PerMessageResult, in_process
from bench.profile import breakdown, stage_of_stack
from bench.targets import check_targets

REPO = "/work/checkout"
LOOP = "BaseEventLoop._run_once (/usr/lib/python3.11/asyncio/base_events.py:1922)"
SITE = "/work/checkout/.venv/lib/python3.11/site-packages"


def frame(name: str, path: str) -> str:
    return f"{name} ({path}:10)"


def result(real_us: float, in_process_us: float, client_us: float) -> PerMessageResult:
    messages = 150_000
    drained = Drained(messages, 7.5, real_us * messages / 1e6)
    return PerMessageResult(
        messages, drained, in_process_us, client_us, 1_000, {"decode": 0.25, "source": 0.75}
    )


@pytest.mark.parametrize(
    ("path", "stage"),
    [
        ("rowbatch/consumer/sources/kafka/records.py", "source"),
        ("consumer/sources/kafka/records.py", "source"),
        ("rowbatch/wire/headers/fields.py", "decode"),
        ("rowbatch/consumer/engine/batcher.py", "intake"),
        ("rowbatch/consumer/engine/intake_stage.py", "intake"),
        ("rowbatch/consumer/model/chunk_check.py", "check"),
        ("rowbatch/consumer/model/inference/triton.py", "inference"),
        ("rowbatch/consumer/engine/write_stage.py", "write"),
        ("rowbatch/consumer/sinks/postgres/copy_binary.py", "write"),
        ("rowbatch/consumer/observe/metrics.py", "metrics"),
        ("rowbatch/consumer/engine/pipeline.py", "other"),
    ],
)
def test_a_frame_of_the_checkout_is_in_its_stage(path: str, stage: str) -> None:
    frames = [LOOP, frame("f", f"{REPO}/{path}")]
    assert stage_of_stack(frames, REPO) == stage


def test_a_library_frame_counts_before_the_code_that_called_it() -> None:
    fetch = frame("Fetcher.fetched_records", f"{SITE}/aiokafka/consumer/fetcher.py")
    poll = frame("KafkaSource._poll_loop", f"{REPO}/rowbatch/consumer/sources/kafka/source.py")
    assert stage_of_stack([LOOP, poll, fetch], REPO) == "broker client"
    numpy = frame("concatenate", f"{SITE}/numpy/core/multiarray.py")
    batcher = frame("_concat", f"{REPO}/rowbatch/consumer/engine/batcher.py")
    assert stage_of_stack([LOOP, batcher, numpy], REPO) == "intake"  # numpy claims nothing


def test_a_sample_in_the_loop_with_no_stage_is_the_event_loop() -> None:
    select = frame("EpollSelector.select", "/usr/lib/python3.11/selectors.py")
    assert stage_of_stack([LOOP, select], REPO) == "event loop"


def test_breakdown_counts_samples_per_stage() -> None:
    records = frame("hold", f"{REPO}/rowbatch/consumer/sources/kafka/records.py")
    decode = frame("decode_chunk", f"{REPO}/rowbatch/wire/chunks/decode.py")
    raw = f"process 1:x;{LOOP};{records} 3\nprocess 1:x;{LOOP};{decode} 2\n"
    counts = breakdown(raw, REPO)
    assert counts["source"] == 3 and counts["decode"] == 2 and counts["other"] == 0


def test_the_table_shows_each_figure_and_the_stages() -> None:
    rendered = result(47.3, 16.2, 3.8).table().render()
    for figure in ("47.3", "20,000", "16.2", "3.8", "4.3x", "decode 25%", "source 75%"):
        assert figure in rendered


def test_the_targets_are_met_at_their_limits_and_missed_past_them() -> None:
    met = {t.name: t.met for t in check_targets({"per_message": result(30.0, 15.0, 3.0)})}
    missed = {t.name: t.met for t in check_targets({"per_message": result(30.5, 15.1, 3.0)})}
    assert len(met) == 2 and all(met.values())
    assert len(missed) == 2 and not any(missed.values())


def test_it_is_in_the_default_run() -> None:
    assert "per_message" in cli.parse_args([]).only


def test_the_in_process_figures_are_positive_and_the_pipeline_costs_more() -> None:
    pipeline_us, client_us = in_process()
    assert 0 < client_us < pipeline_us
