"""The server's own queue, from its Prometheus metrics: vLLM's ``vllm:num_requests_waiting`` and
``vllm:num_requests_running``, SGLang's ``sglang:num_queue_reqs`` and
``sglang:num_running_reqs``, llama.cpp's ``llamacpp:requests_deferred`` and
``llamacpp:requests_processing``. A server whose metrics hold none of them (or that serves no
``/metrics``) is left alone: its window stays as configured, moved only by 429/503."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

#: (waiting, running) metric names per server family.
QUEUE_METRICS: Final[tuple[tuple[str, str], ...]] = (
    ("vllm:num_requests_waiting", "vllm:num_requests_running"),
    ("sglang:num_queue_reqs", "sglang:num_running_reqs"),
    ("llamacpp:requests_deferred", "llamacpp:requests_processing"),
)


@dataclass(frozen=True)
class QueueReading:
    waiting: float
    running: float


def read_queue(text: str, model: str) -> QueueReading | None:
    """The queue in a ``/metrics`` page, for ``model`` where the samples name models (a
    ``model_name`` label); None when the page has none of :data:`QUEUE_METRICS`."""
    values: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    wanted = {name for pair in QUEUE_METRICS for name in pair}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                values.setdefault(sample.name, []).append((sample.labels, sample.value))
    for waiting, running in QUEUE_METRICS:
        if waiting in values:
            return QueueReading(
                _total(values[waiting], model), _total(values.get(running, []), model)
            )
    return None


def _total(samples: list[tuple[Mapping[str, str], float]], model: str) -> float:
    mine = [v for labels, v in samples if labels.get("model_name") == model]
    return sum(mine) if mine else sum(v for _, v in samples)
