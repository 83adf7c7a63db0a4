"""The whole local stack: Kafka, Pub/Sub, Triton and PostgreSQL, started side by side."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harness.jaeger import JaegerEndpoint, JaegerService
from harness.kafka import KafkaEndpoint, KafkaService
from harness.postgres import PostgresEndpoint, PostgresService
from harness.prometheus import PrometheusEndpoint, local_stack_prometheus
from harness.pubsub import PubSubEndpoint, PubSubService
from harness.service import ManagedService, RunDir
from harness.triton import TritonEndpoint, TritonService


@dataclass(frozen=True)
class StackEndpoints:
    kafka: KafkaEndpoint
    pubsub: PubSubEndpoint
    triton: TritonEndpoint
    postgres: PostgresEndpoint
    startup_s: dict[str, float]
    """Seconds each service took from launch to its first successful client call."""
    prometheus: PrometheusEndpoint | None = None
    """Prometheus scraping consumers and Triton (``local_stack(run, prometheus=True)``)."""
    jaeger: JaegerEndpoint | None = None
    """A trace backend (``local_stack(run, jaeger=True)``; docs/tracing.md)."""

    def env(self) -> dict[str, str]:
        """Environment variables that point rowbatch and the brokers' own clients here."""
        return {
            **self.pubsub.env(),
            "ROWBATCH_KAFKA_BOOTSTRAP": self.kafka.bootstrap_servers,
            "ROWBATCH_TRITON_GRPC": self.triton.grpc_url,
            "ROWBATCH_POSTGRES_DSN": self.postgres.dsn,
            **({"OTEL_EXPORTER_OTLP_ENDPOINT": self.jaeger.otlp} if self.jaeger else {}),
        }

    def describe(self) -> str:
        rows = [
            ("Kafka", self.kafka.bootstrap_servers, "kafka"),
            ("Pub/Sub", f"{self.pubsub.host} ({self.pubsub.kind})", "pubsub"),
            ("Triton gRPC", self.triton.grpc_url, "triton"),
            ("Triton HTTP", self.triton.http_url, "triton"),
            ("Triton metrics", self.triton.metrics_url, "triton"),
            ("PostgreSQL", self.postgres.dsn, "postgres"),
        ]
        if self.prometheus is not None:
            rows.append(("Prometheus", self.prometheus.url, "prometheus"))
        if self.jaeger is not None:
            rows.append(("Jaeger OTLP (gRPC)", self.jaeger.otlp, "jaeger"))
            rows.append(("Jaeger query API", f"{self.jaeger.ui}/api/v3/traces", "jaeger"))
        width = max(len(name) for name, _, _ in rows)
        lines = [
            f"  {name:<{width}}  {where:<48} ready in {self.startup_s[svc]:.1f} s"
            for name, where, svc in rows
        ]
        return "\n".join(lines)


def _timed(service: ManagedService[Any]) -> Callable[[], tuple[Any, float]]:
    def run() -> tuple[Any, float]:
        started = time.monotonic()
        endpoint = service.start()
        return endpoint, time.monotonic() - started

    return run


@contextlib.contextmanager
def local_stack(
    run: RunDir, prometheus: bool = False, pubsub_heap: str = "512m", jaeger: bool = False
) -> Iterator[StackEndpoints]:
    """Start all four services in parallel (then Prometheus, scraping Triton and consumers, and
    Jaeger, if asked); stop every one that started, even on failure."""
    services: dict[str, ManagedService[Any]] = {
        "kafka": KafkaService(run),
        "pubsub": PubSubService(run, heap=pubsub_heap),
        "triton": TritonService(run),
        "postgres": PostgresService(run),
    }
    try:
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            futures = {name: pool.submit(_timed(svc)) for name, svc in services.items()}
            results = {name: future.result() for name, future in futures.items()}
        if prometheus:
            services["prometheus"] = local_stack_prometheus(run, results["triton"][0].metrics_url)
            results["prometheus"] = _timed(services["prometheus"])()
        if jaeger:
            services["jaeger"] = JaegerService(run)
            results["jaeger"] = _timed(services["jaeger"])()
        yield StackEndpoints(
            kafka=results["kafka"][0],
            pubsub=results["pubsub"][0],
            triton=results["triton"][0],
            postgres=results["postgres"][0],
            startup_s={name: seconds for name, (_, seconds) in results.items()},
            prometheus=results["prometheus"][0] if prometheus else None,
            jaeger=results["jaeger"][0] if jaeger else None,
        )
    finally:
        for service in services.values():
            service.stop()
