"""The share-group source's own counters (in the consumer's registry): records each member
took, records delivered again (the broker's delivery count above 1: a lock that ran out, a
release, a member that died), acknowledgements by type, acknowledgement commits the broker
refused, and members remade after their client failed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from rowbatch.consumer.sources.kafka_share.member import Ack


class ShareMetrics:
    def __init__(self, registry: CollectorRegistry, topic: str) -> None:
        self._topic = topic
        self.records = Counter(
            "rowbatch_kafka_share_records",
            "Records a share-group member took from the broker (each member's share)",
            ["topic", "member"],
            registry=registry,
        )
        self.redelivered = Counter(
            "rowbatch_kafka_share_redelivered_records",
            "Records taken with a delivery count above 1: delivered before and not "
            "acknowledged (a lock that ran out, a release, a member that stopped or died)",
            ["topic"],
            registry=registry,
        )
        self.acks = Counter(
            "rowbatch_kafka_share_acknowledgements",
            "Records acknowledged: accept (written), release (given back), reject "
            "(dead-lettered by rowbatch first)",
            ["topic", "type"],
            registry=registry,
        )
        self.refused = Counter(
            "rowbatch_kafka_share_refused_acknowledgements",
            "Acknowledgement commits the broker refused, per partition (the records' locks "
            "had run out: they were delivered again, and written again as no-ops)",
            ["topic"],
            registry=registry,
        )
        self.restarts = Counter(
            "rowbatch_kafka_share_member_restarts",
            "Share consumers made again after their client failed",
            ["topic"],
            registry=registry,
        )
        for ack in Ack:
            self.acks.labels(topic, ack.value)
        self.redelivered.labels(topic)
        self.refused.labels(topic)
        self.restarts.labels(topic)

    def took(self, member: int, records: int, redelivered: int) -> None:
        self.records.labels(self._topic, str(member)).inc(records)
        if redelivered:
            self.redelivered.labels(self._topic).inc(redelivered)

    def acknowledged(self, ack: Ack) -> None:
        self.acks.labels(self._topic, ack.value).inc()

    def refused_commits(self, partitions: int) -> None:
        self.refused.labels(self._topic).inc(partitions)

    def restarted(self, _: BaseException) -> None:
        self.restarts.labels(self._topic).inc()
