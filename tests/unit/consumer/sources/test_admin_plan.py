"""``admin ensure``'s plans, computed from fake broker states: what is created and in which order,
that every differing field is named, that a dry run changes nothing and a second run finds
everything in place; plus the config fields it reads and the command's exit codes."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rowbatch.consumer.service import admin as admin_cmd
from rowbatch.consumer.service.config import ConfigError
from rowbatch.consumer.sources.admin_plan import AdminUnreachable, Outcome
from rowbatch.consumer.sources.kafka import admin as kafka_admin
from rowbatch.consumer.sources.kafka.admin import TopicSpec, TopicState
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub import admin as pubsub_admin
from rowbatch.consumer.sources.pubsub.admin import (
    Observed,
    PubSubLayout,
    SubscriptionSpec,
    SubscriptionState,
)
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings

P = "projects/p"


def _settings(**extra: object) -> PubSubSettings:
    return PubSubSettings.model_validate(
        {
            "subscription": f"{P}/subscriptions/rows",
            "topic": f"{P}/topics/rows",
            "dead_letter_topic": f"{P}/topics/rows-dlq",
            **extra,
        }
    )


def _layout(**extra: object) -> PubSubLayout:
    return admin_cmd.pubsub_layout(_settings(**extra))


def _state(spec: SubscriptionSpec) -> SubscriptionState:
    """The subscription exactly as ``spec`` wants it (what the server returns after creating
    it: Pub/Sub's default 10 s ack deadline where the spec sets none)."""
    return SubscriptionState(
        name=spec.name,
        topic=spec.topic,
        ack_deadline_s=spec.ack_deadline_s or 10,
        retry_backoff_s=spec.retry_backoff_s,
        dead_letter_topic=spec.dead_letter_topic,
        max_delivery_attempts=spec.max_delivery_attempts,
    )


@dataclass
class FakePubSub:
    """``PubSubAdmin`` over dicts; records the creations."""

    topics: set[str] = field(default_factory=set)
    subscriptions: dict[str, SubscriptionState] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    address: str = "127.0.0.1:8085"

    def topic_exists(self, topic: str) -> bool:
        return topic in self.topics

    def get_subscription(self, name: str) -> SubscriptionState | None:
        return self.subscriptions.get(name)

    def create_topic(self, topic: str) -> None:
        assert topic not in self.topics
        self.topics.add(topic)
        self.created.append(topic)

    def create_subscription(self, spec: SubscriptionSpec) -> None:
        assert spec.topic in self.topics, "a subscription's topic is created first"
        if spec.dead_letter_topic is not None:
            assert spec.dead_letter_topic in self.topics
        self.subscriptions[spec.name] = _state(spec)
        self.created.append(spec.name)

    def close(self) -> None:
        pass


def test_layout_from_config_derives_the_policy_and_the_dead_letter_subscription() -> None:
    layout = _layout(max_delivery_attempts=7)
    assert layout.topic == f"{P}/topics/rows"
    sub = layout.subscription
    assert sub.topic == layout.topic
    assert sub.ack_deadline_s == 60
    assert sub.retry_backoff_s == (1.0, 60.0)
    assert sub.dead_letter_topic == f"{P}/topics/rows-dlq"
    assert sub.max_delivery_attempts == 8  # the consumer (7) dead-letters first, with a reason
    assert layout.dead_letter_subscription.name == f"{P}/subscriptions/rows-dlq"
    assert layout.dead_letter_subscription.topic == f"{P}/topics/rows-dlq"
    assert _layout().subscription.max_delivery_attempts == 5  # Pub/Sub's minimum
    explicit = _layout(
        policy_max_delivery_attempts=20,
        dead_letter_subscription=f"{P}/subscriptions/kept",
        ack_deadline_s=30,
        retry_min_backoff_s=5,
        retry_max_backoff_s=300,
    )
    assert explicit.subscription.max_delivery_attempts == 20
    assert explicit.subscription.ack_deadline_s == 30
    assert explicit.subscription.retry_backoff_s == (5, 300)
    assert explicit.dead_letter_subscription.name == f"{P}/subscriptions/kept"


def test_layout_names_the_missing_fields() -> None:
    bare = PubSubSettings(subscription=f"{P}/subscriptions/rows")
    with pytest.raises(ConfigError, match=r"source\.topic .*source\.dead_letter_topic"):
        admin_cmd.pubsub_layout(bare)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"retry_min_backoff_s": 30, "retry_max_backoff_s": 10}, "retry_min_backoff_s"),
        ({"ack_deadline_s": 5}, "ack_deadline_s"),
        ({"ack_deadline_s": 601}, "ack_deadline_s"),
        ({"policy_max_delivery_attempts": 4}, "policy_max_delivery_attempts"),
        ({"policy_max_delivery_attempts": 101}, "policy_max_delivery_attempts"),
        (
            {"policy_max_delivery_attempts": 5, "max_delivery_attempts": 5},
            "max_delivery_attempts must be below",
        ),
        ({"dead_letter_topic": f"{P}/topics/rows"}, "must differ"),
        ({"topic": "rows"}, "topic"),
    ],
)
def test_invalid_admin_fields_are_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(**fields)


def test_kafka_admin_fields_are_validated() -> None:
    base = {"bootstrap_servers": "k:9092", "topic": "rows", "group_id": "g"}
    assert KafkaSettings.model_validate(base).replication_factor == 3
    for bad in ({"partitions": 0}, {"replication_factor": 0}, {"retention_ms": -2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            KafkaSettings.model_validate({**base, **bad})


def test_nothing_there_creates_topics_first_and_the_subscription_last() -> None:
    layout = _layout()
    planned = pubsub_admin.plan(layout, Observed(frozenset(), {}), address="h:1")
    assert [(s.kind, s.outcome) for s in planned.steps] == [
        ("topic", Outcome.CREATE),
        ("dead-letter topic", Outcome.CREATE),
        ("dead-letter subscription", Outcome.CREATE),
        ("subscription", Outcome.CREATE),
    ]
    text = "\n".join(planned.lines())
    assert "Pub/Sub at h:1" in text
    assert "ack deadline 60 s" in text
    assert "retry backoff 1-60 s" in text
    assert f"dead letters to {P}/topics/rows-dlq after 5 delivery attempts" in text


def test_every_differing_subscription_field_is_named() -> None:
    layout = _layout()
    wrong = SubscriptionState(
        name=layout.subscription.name,
        topic=f"{P}/topics/other",
        ack_deadline_s=10,
        retry_backoff_s=None,
        dead_letter_topic=f"{P}/topics/elsewhere",
        max_delivery_attempts=9,
    )
    observed = Observed(
        frozenset({layout.topic, layout.dead_letter_topic}),
        {
            layout.subscription.name: wrong,
            layout.dead_letter_subscription.name: _state(layout.dead_letter_subscription),
        },
    )
    planned = pubsub_admin.plan(layout, observed, address="h:1")
    (differs,) = planned.differing
    assert differs.name == layout.subscription.name
    fields = {d.field: (d.want, d.have) for d in differs.differences}
    assert fields == {
        "topic": (layout.topic, f"{P}/topics/other"),
        "ack_deadline_seconds": ("60", "10"),
        "retry_policy": ("backoff 1-60 s", "none"),
        "dead_letter_policy.dead_letter_topic": (layout.dead_letter_topic, f"{P}/topics/elsewhere"),
        "dead_letter_policy.max_delivery_attempts": ("5", "9"),
    }
    assert "ack_deadline_seconds is 10, the config wants 60" in differs.describe()
    assert not planned.to_create


def test_the_dead_letter_subscription_is_compared_on_its_topic_only() -> None:
    layout = _layout()
    kept = SubscriptionState(layout.dead_letter_subscription.name, "x", 600, (1, 2), None, None)
    observed = Observed(frozenset({layout.topic, layout.dead_letter_topic}), {kept.name: kept})
    planned = pubsub_admin.plan(layout, observed, address="h:1")
    (differs,) = planned.differing
    assert [d.field for d in differs.differences] == ["topic"]


def test_ensure_creates_what_is_absent_and_a_second_run_finds_it_all() -> None:
    layout = _layout()
    fake = FakePubSub(topics={layout.topic})
    first = pubsub_admin.ensure(fake, layout)
    assert [s.outcome for s in first.steps] == [Outcome.OK, *[Outcome.CREATE] * 3]
    assert fake.created == [
        layout.dead_letter_topic,
        layout.dead_letter_subscription.name,
        layout.subscription.name,
    ]
    second = pubsub_admin.ensure(fake, layout)
    assert {s.outcome for s in second.steps} == {Outcome.OK}
    assert len(fake.created) == 3


def test_a_dry_run_changes_nothing() -> None:
    layout = _layout()
    fake = FakePubSub()
    planned = pubsub_admin.ensure(fake, layout, dry_run=True)
    assert len(planned.to_create) == 4
    assert fake.created == []


# --- Kafka ----------------------------------------------------------------------------------


@dataclass
class FakeKafka:
    topics: dict[str, TopicState] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    address: str = "k:9092"

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        return {n: self.topics[n] for n in names if n in self.topics}

    async def create(self, spec: TopicSpec) -> None:
        self.topics[spec.name] = TopicState(
            spec.name, spec.partitions, spec.replication_factor, spec.retention_ms
        )
        self.created.append(spec.name)


SPECS = [
    ("topic", TopicSpec("rows", 6, 3, 604_800_000)),
    ("dead-letter topic", TopicSpec("rows.dlq", 1, 3, 604_800_000)),
]


async def test_kafka_creates_absent_topics_and_is_idempotent() -> None:
    fake = FakeKafka()
    first = await kafka_admin.ensure(fake, SPECS)
    assert [s.outcome for s in first.steps] == [Outcome.CREATE, Outcome.CREATE]
    assert "6 partitions, replication factor 3, retention.ms=604800000" in first.lines()[1]
    assert fake.created == ["rows", "rows.dlq"]
    second = await kafka_admin.ensure(fake, SPECS)
    assert {s.outcome for s in second.steps} == {Outcome.OK}
    assert fake.created == ["rows", "rows.dlq"]


async def test_kafka_dry_run_changes_nothing() -> None:
    fake = FakeKafka()
    planned = await kafka_admin.ensure(fake, SPECS, dry_run=True)
    assert len(planned.to_create) == 2
    assert fake.created == []


def test_kafka_names_every_differing_field() -> None:
    observed = {
        "rows": TopicState("rows", 3, 1, 86_400_000),
        "rows.dlq": TopicState("rows.dlq", 1, 3, 604_800_000),
    }
    planned = kafka_admin.plan(SPECS, observed, address="k:9092")
    (differs,) = planned.differing
    assert [(d.field, d.want, d.have) for d in differs.differences] == [
        ("partitions", "6", "3"),
        ("replication factor", "3", "1"),
        ("retention.ms", "604800000", "86400000"),
    ]
    assert planned.steps[1].outcome is Outcome.OK


# --- the command ----------------------------------------------------------------------------

_TOML = """
[source]
kind = "pubsub"
subscription = "projects/p/subscriptions/rows"
topic = "projects/p/topics/rows"
dead_letter_topic = "projects/p/topics/rows-dlq"
[model]
name = "m"
[binding]
inputs = {text = "TEXT"}
outputs = {OUT = "out"}
"""


def _run(
    tmp_path: Path, fake: object, monkeypatch: pytest.MonkeyPatch, *, dry_run: bool = False
) -> tuple[int, str, str]:
    path = tmp_path / "c.toml"
    path.write_text(_TOML)
    monkeypatch.setattr(pubsub_admin, "GooglePubSubAdmin", lambda timeout_s, project=None: fake)
    out, err = io.StringIO(), io.StringIO()
    code = admin_cmd.ensure_broker(path, dry_run=dry_run, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakePubSub()
    code, out, _ = _run(tmp_path, fake, monkeypatch, dry_run=True)
    assert code == admin_cmd.EXIT_OK
    assert "dry run: nothing changed (4 to create, 0 differ)" in out
    assert fake.created == []

    code, out, _ = _run(tmp_path, fake, monkeypatch)
    assert (code, len(fake.created)) == (admin_cmd.EXIT_OK, 4)
    assert "created 4; 0 differ" in out

    name = f"{P}/subscriptions/rows"
    fake.subscriptions[name] = SubscriptionState(
        name, f"{P}/topics/rows", 10, (1, 60), f"{P}/topics/rows-dlq", 5
    )
    code, out, err = _run(tmp_path, fake, monkeypatch)
    assert code == admin_cmd.EXIT_DIFFERS
    assert "ack_deadline_seconds is 10, the config wants 60" in out
    assert "differ from the configuration" in err


def test_unreachable_broker_exit_code_names_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Down(FakePubSub):
        def topic_exists(self, topic: str) -> bool:
            raise AdminUnreachable("Pub/Sub at 10.9.9.9:8085 did not answer within 1 s")

    code, _, err = _run(tmp_path, Down(), monkeypatch)
    assert code == admin_cmd.EXIT_UNREACHABLE
    assert "10.9.9.9:8085" in err


def test_config_error_exit_code(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(_TOML.replace('topic = "projects/p/topics/rows"\n', ""))
    err = io.StringIO()
    assert admin_cmd.ensure_broker(path, err=err) == admin_cmd.EXIT_CONFIG
    assert "source.topic" in err.getvalue()
