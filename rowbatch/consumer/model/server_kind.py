"""Batch size and requests in flight when the configuration does not set them, per kind of
model server. The kind comes from the server's ServerMetadata name, read once at discovery.

    kind (ServerMetadata name)  batch size (model.batch_size)   in flight per server
                                                                (model.max_in_flight)
    triton (spec from           largest preferred batch size,   per model instance, two
    ModelConfig)                else max_batch_size             executions of max_batch_size
                                                                (one running, one queued), >= 2
    mlserver                    256                             8
    kserve                      256                             4
    any other                   256                             4

Without ModelConfig the server does not say how many rows it takes at once, so the consumer
sends :data:`DEFAULT_BATCH_SIZE` rows per request. MLServer's adaptive batching merges whole
*requests* (its ``max_batch_size`` counts requests): with only 2 in flight it has nothing to
merge, with 8 it fills (the scorer formula, 256 rows per request, this 2-core machine:
``python -m bench oip_servers`` at the server 99k rows/s with 2 in flight, 220k with 8;
``python -m bench oip_e2e`` through a consumer from Kafka into PostgreSQL, which bounds it
there, 61k with 2 and 75k with 8; an outside report saw 26k and 41k). If its
``max_batch_size`` is raised above 8, raise ``model.max_in_flight`` to match.
Servers that run each request on its own (KServe's Python model server, unknown ones) get 4:
one request running while the next ones travel. A spec read from ModelConfig follows Triton's
rule whatever the server calls itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from rowbatch.consumer.model.spec import ModelConfigError, ModelSpec

#: Rows per request for a model whose spec did not come from ModelConfig (no
#: ``max_batch_size`` or preferred size is known) and no ``model.batch_size`` is configured.
DEFAULT_BATCH_SIZE: Final = 256


@dataclass(frozen=True)
class ServerKind:
    """One row of the table above."""

    name: str
    """``triton``, ``mlserver``, ``kserve`` or ``other``."""
    in_flight: int
    """Requests in flight per server for a spec not from ModelConfig."""
    batches_requests: bool = False
    """The server merges concurrent requests into one execution (Triton's dynamic batcher,
    MLServer's adaptive batching), so it needs several in flight to fill."""


KINDS: Final[Mapping[str, ServerKind]] = MappingProxyType(
    {
        "triton": ServerKind("triton", in_flight=4, batches_requests=True),
        "mlserver": ServerKind("mlserver", in_flight=8, batches_requests=True),
        "kserve": ServerKind("kserve", in_flight=4),
    }
)
OTHER: Final = ServerKind("other", in_flight=4)


def server_kind(server_name: str) -> ServerKind:
    """The kind of the server that calls itself ``server_name`` (ServerMetadata's name, any
    case); :data:`OTHER` for one not in :data:`KINDS` or that did not say."""
    return KINDS.get(server_name.strip().lower(), OTHER)


def target_batch_size(spec: ModelSpec, override: int | None = None) -> int:
    """Rows per request: ``override`` if given, else the largest preferred batch size, else
    ``max_batch_size``, else (a spec not from ModelConfig) :data:`DEFAULT_BATCH_SIZE`.
    Raises :class:`ModelConfigError` for a ModelConfig model that does not batch when no
    override is given, and when the override exceeds the model's ``max_batch_size``."""
    if override is not None:
        if override < 1:
            raise ModelConfigError(f"batch_size must be >= 1, not {override}")
        if spec.max_batch_size > 0 and override > spec.max_batch_size:
            raise ModelConfigError(
                f"batch_size {override} exceeds model {spec.name!r}'s max_batch_size "
                f"{spec.max_batch_size}"
            )
        return override
    if spec.preferred_batch_sizes:
        return max(spec.preferred_batch_sizes)
    if spec.max_batch_size > 0:
        return spec.max_batch_size
    if spec.source != "model_config":
        return DEFAULT_BATCH_SIZE
    raise ModelConfigError(
        f"model {spec.name!r} has max_batch_size 0 (no batching) and no preferred batch size: "
        "configure batch_size"
    )


def default_in_flight(spec: ModelSpec, target: int) -> int:
    """Batches to keep in flight per server when ``max_in_flight`` is not configured.

    From ModelConfig (Triton): enough that every model instance can run one execution of the
    size Triton's dynamic batcher may merge requests into (``max_batch_size``) while another
    as large waits in its queue. With fewer, the batcher merges everything queued into one
    execution and the instance idles while the answers travel back and the next requests come
    in. At least 2 per instance. Otherwise: the server kind's :attr:`ServerKind.in_flight`."""
    if spec.source != "model_config":
        return server_kind(spec.server_name).in_flight
    instances = max(spec.instance_count, 1)
    merged = max(spec.max_batch_size, target)
    return max(2 * instances, -(-2 * instances * merged // max(target, 1)))


def describe_defaults(spec: ModelSpec, batch_size: int | None, max_in_flight: int | None) -> str:
    """``batch size N (why); M in flight per server (why)`` for ``rowbatch-consumer check``."""
    target = target_batch_size(spec, batch_size)
    if batch_size is not None:
        size_why = "model.batch_size"
    elif spec.preferred_batch_sizes:
        size_why = "largest preferred batch size"
    elif spec.max_batch_size > 0:
        size_why = "max_batch_size"
    else:
        size_why = "default without ModelConfig"
    if max_in_flight is not None:
        flight, flight_why = max_in_flight, "model.max_in_flight"
    elif spec.source == "model_config":
        flight, flight_why = default_in_flight(spec, target), "from the model config"
    else:
        kind = server_kind(spec.server_name).name
        flight, flight_why = default_in_flight(spec, target), f"default for {kind}"
    return f"batch size {target} ({size_why}); {flight} in flight per server ({flight_why})"
