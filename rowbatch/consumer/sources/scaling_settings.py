"""``ScalingInputs``: the ``[source]`` fields of the autoscaling figure
(``rowbatch_desired_replicas``, docs/autoscaling.md) that every broker source shares, declared
once; each source adds its own ``target_latency_s``, whose default differs per broker."""

from __future__ import annotations

from pydantic import Field

from rowbatch.consumer.section import Section


class ScalingInputs(Section):
    """Inputs of ``rowbatch_desired_replicas`` (and Pub/Sub's ``rowbatch_replica_load``)."""

    rows_per_s_per_replica: float | None = Field(default=None, gt=0)
    """What one replica sustains; None: measured while the replica is saturated."""
    rate_window_s: float = Field(default=60.0, gt=0)
    """The write and receive rates are means over this span."""
    max_replicas: int | None = Field(default=None, ge=1)
    """The most replicas worth asking for (what the model servers can feed,
    ``ceil(server rows/s / rows_per_s_per_replica)``). A Kafka topic's partition count caps
    it anyway; None: no cap beyond that (Pub/Sub: none at all)."""
