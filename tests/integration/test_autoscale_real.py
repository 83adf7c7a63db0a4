"""Autoscaling on the real stack: a burst of 48,000 rows (8.4x what one consumer drains within
its 3 s target latency) between steady phases, with consumer processes started and stopped by
the test-only controller (``bench/autoscale_real/controller.py``: the HPA's rule on
``rowbatch_desired_replicas``, at 10x the HPA's pace). The replicas rise, the backlog drains,
every row is written once, the replicas come back to the minimum, and nothing flaps while the
load is steady; and the simulator, replaying the same arrivals, predicts its replica-seconds,
peak and reversals within a margin (``pytest -s`` prints both)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.autoscale_real.compare import agreement, comparison_table, simulate_same, timeline
from bench.autoscale_real.run import SHORT_PLAN, RealRun, Setup, run_burst
from bench.autoscale_real.stack import Broker, Services, model_repository
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService


@pytest.fixture(scope="module")
def autoscale_triton(run_dir: RunDir) -> Iterator[TritonEndpoint]:
    """A Triton serving the three-instance ``fixed_latency`` variant the run scales against."""
    repo = model_repository(run_dir.data("autoscale-models"))
    with TritonService(run_dir, repo, name="triton-autoscale") as endpoint:
        yield endpoint


def check(run: RealRun) -> None:
    sim = simulate_same(run)
    print(comparison_table([(run, sim)]).render())
    print(timeline(run))
    failed = [name for name, ok in (run.checks() | agreement(run, sim)).items() if not ok]
    events = ", ".join(f"{e.at_s:.1f} s: {e.before}->{e.after}" for e in run.events)
    assert not failed, (
        f"{run.broker}: {', '.join(failed)}; published {run.published:,}, written "
        f"{run.written:,} ({run.distinct_ids:,} ids, complete {run.ids_complete}), executed "
        f"{run.executed:,}; events {events}; exit codes {run.exit_codes}; "
        f"final replicas {run.final_replicas}"
    )


def burst(broker: Broker, services: Services, tmp_path: Path) -> RealRun:
    return run_burst(broker, services, SHORT_PLAN, Setup(), tmp_path / "consumers")


@pytest.mark.timeout(240)
def test_kafka_consumers_scale_out_on_a_burst_and_back(
    kafka: KafkaEndpoint,
    autoscale_triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    check(burst("kafka", Services(autoscale_triton, postgres, kafka=kafka), tmp_path))


@pytest.mark.timeout(240)
def test_pubsub_consumers_scale_out_on_a_burst_and_back(
    pubsub: PubSubEndpoint,
    autoscale_triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    check(burst("pubsub", Services(autoscale_triton, postgres, pubsub=pubsub), tmp_path))
