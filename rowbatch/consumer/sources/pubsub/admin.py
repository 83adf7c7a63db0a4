"""Creating and checking what a Pub/Sub consumer needs: its topic, the dead-letter topic, a
subscription on the dead-letter topic that keeps the dead letters, and the subscription (ack
deadline, retry policy, dead-letter policy). ``plan`` is pure; ``ensure`` observes, plans and
creates through the ``PubSubAdmin`` protocol; ``GooglePubSubAdmin`` is the real one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.pubsub_v1 import types as pstypes

from rowbatch.consumer.sources.admin_plan import (
    AdminFailed,
    AdminUnreachable,
    Difference,
    Outcome,
    Plan,
    Step,
    compare,
    step,
)
from rowbatch.consumer.sources.pubsub.clients import default_publisher, default_subscriber
from rowbatch.pubsub_env import GOOGLE_PUBSUB_ADDRESS, pubsub_address

GOOGLE_ADDRESS = GOOGLE_PUBSUB_ADDRESS

T = TypeVar("T")


@dataclass(frozen=True)
class SubscriptionSpec:
    """A subscription as the config wants it; a None field is neither set nor compared."""

    name: str
    topic: str
    ack_deadline_s: int | None = None
    retry_backoff_s: tuple[float, float] | None = None
    """The retry policy's (minimum, maximum) backoff; None: no retry policy is set."""
    dead_letter_topic: str | None = None
    max_delivery_attempts: int | None = None
    """The dead-letter policy's; set with ``dead_letter_topic``."""

    def settings(self) -> str:
        parts = [f"topic {self.topic}"]
        if self.ack_deadline_s is not None:
            parts.append(f"ack deadline {self.ack_deadline_s} s")
        if self.retry_backoff_s is not None:
            low, high = self.retry_backoff_s
            parts.append(f"retry backoff {low:g}-{high:g} s")
        if self.dead_letter_topic is not None:
            parts.append(
                f"dead letters to {self.dead_letter_topic} after "
                f"{self.max_delivery_attempts} delivery attempts"
            )
        return ", ".join(parts)


@dataclass(frozen=True)
class PubSubLayout:
    """Everything one consumer configuration needs on Pub/Sub."""

    topic: str
    dead_letter_topic: str
    subscription: SubscriptionSpec
    dead_letter_subscription: SubscriptionSpec


@dataclass(frozen=True)
class SubscriptionState:
    """An existing subscription, as the server describes it."""

    name: str
    topic: str
    ack_deadline_s: int
    retry_backoff_s: tuple[float, float] | None
    dead_letter_topic: str | None
    max_delivery_attempts: int | None


@dataclass(frozen=True)
class Observed:
    """What exists: topics by name, subscriptions by name (absent ones are left out)."""

    topics: frozenset[str]
    subscriptions: Mapping[str, SubscriptionState]


class PubSubAdmin(Protocol):
    """The administrative calls ``ensure`` makes."""

    @property
    def address(self) -> str: ...

    def topic_exists(self, topic: str) -> bool: ...

    def get_subscription(self, name: str) -> SubscriptionState | None: ...

    def create_topic(self, topic: str) -> None: ...

    def create_subscription(self, spec: SubscriptionSpec) -> None: ...


def observe(admin: PubSubAdmin, layout: PubSubLayout) -> Observed:
    topics = frozenset(t for t in (layout.topic, layout.dead_letter_topic) if admin.topic_exists(t))
    subscriptions: dict[str, SubscriptionState] = {}
    for spec in (layout.dead_letter_subscription, layout.subscription):
        found = admin.get_subscription(spec.name)
        if found is not None:
            subscriptions[spec.name] = found
    return Observed(topics, subscriptions)


def plan(layout: PubSubLayout, observed: Observed, *, address: str) -> Plan:
    """The steps, in creation order: topics first (the subscriptions name them), the
    dead-letter subscription before the subscription whose policy forwards to its topic."""
    steps: list[Step] = []
    for kind, topic in (("topic", layout.topic), ("dead-letter topic", layout.dead_letter_topic)):
        outcome = Outcome.OK if topic in observed.topics else Outcome.CREATE
        steps.append(Step(kind, topic, outcome))
    for kind, spec in (
        ("dead-letter subscription", layout.dead_letter_subscription),
        ("subscription", layout.subscription),
    ):
        have = observed.subscriptions.get(spec.name)
        if have is None:
            steps.append(Step(kind, spec.name, Outcome.CREATE, spec.settings()))
        else:
            steps.append(step(kind, spec.name, spec.settings(), _differences(spec, have)))
    notes = (
        "Pub/Sub's service agent needs roles/pubsub.publisher on the dead-letter topic and "
        "roles/pubsub.subscriber on the subscription for the dead-letter policy to work "
        "(IAM is not checked here)",
    )
    return Plan(f"Pub/Sub at {address}", tuple(steps), notes if address == GOOGLE_ADDRESS else ())


def _differences(spec: SubscriptionSpec, have: SubscriptionState) -> list[Difference | None]:
    found: list[Difference | None] = [compare("topic", spec.topic, have.topic)]
    if spec.ack_deadline_s is not None:
        found.append(compare("ack_deadline_seconds", spec.ack_deadline_s, have.ack_deadline_s))
    if spec.retry_backoff_s is not None:
        found.append(
            compare("retry_policy", _backoff(spec.retry_backoff_s), _backoff(have.retry_backoff_s))
        )
    if spec.dead_letter_topic is not None:
        found.append(
            compare(
                "dead_letter_policy.dead_letter_topic",
                spec.dead_letter_topic,
                have.dead_letter_topic,
            )
        )
        found.append(
            compare(
                "dead_letter_policy.max_delivery_attempts",
                spec.max_delivery_attempts,
                have.max_delivery_attempts,
            )
        )
    return found


def _backoff(value: tuple[float, float] | None) -> str | None:
    return None if value is None else f"backoff {value[0]:g}-{value[1]:g} s"


def apply(admin: PubSubAdmin, layout: PubSubLayout, planned: Plan) -> None:
    """Create what ``planned`` says is absent, in its order."""
    subscriptions = {s.name: s for s in (layout.subscription, layout.dead_letter_subscription)}
    for s in planned.to_create:
        if s.name in subscriptions:
            admin.create_subscription(subscriptions[s.name])
        else:
            admin.create_topic(s.name)


def ensure(admin: PubSubAdmin, layout: PubSubLayout, *, dry_run: bool = False) -> Plan:
    """Observe, plan, and (unless ``dry_run``) create what is absent; returns the plan."""
    planned = plan(layout, observe(admin, layout), address=admin.address)
    if not dry_run:
        apply(admin, layout, planned)
    return planned


class GooglePubSubAdmin:
    """``PubSubAdmin`` on Google Cloud Pub/Sub, or on the emulator PUBSUB_EMULATOR_HOST
    names. Calls are retried while the server is unavailable, for up to ``timeout_s``.
    Without the emulator and without Google credentials: ``PubSubCredentialsError`` (a
    configuration error) naming ``project`` and what to set."""

    def __init__(self, timeout_s: float = 30.0, *, project: str | None = None) -> None:
        self._address = pubsub_address()
        self._timeout_s = timeout_s
        self._publisher = default_publisher(project)
        self._subscriber = default_subscriber(project)
        self._retry = Retry(
            predicate=if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded),
            initial=0.2,
            maximum=2.0,
            multiplier=2.0,
            timeout=timeout_s,
        )

    @property
    def address(self) -> str:
        return self._address

    def close(self) -> None:
        self._publisher.transport.close()
        self._subscriber.close()

    def topic_exists(self, topic: str) -> bool:
        call = self._publisher.get_topic
        return self._lookup(f"topic {topic}", lambda: call(request={"topic": topic}, **self._opts))

    def get_subscription(self, name: str) -> SubscriptionState | None:
        call = self._subscriber.get_subscription
        found: list[Any] = []

        def get() -> None:
            found.append(call(request={"subscription": name}, **self._opts))

        if not self._lookup(f"subscription {name}", get):
            return None
        return _state(found[0])

    def create_topic(self, topic: str) -> None:
        call = self._publisher.create_topic
        self._create(f"topic {topic}", lambda: call(request={"name": topic}, **self._opts))

    def create_subscription(self, spec: SubscriptionSpec) -> None:
        call = self._subscriber.create_subscription
        request = _subscription(spec)
        self._create(f"subscription {spec.name}", lambda: call(request=request, **self._opts))

    @property
    def _opts(self) -> dict[str, Any]:
        return {"retry": self._retry, "timeout": min(self._timeout_s, 10.0)}

    def _lookup(self, what: str, call: Callable[[], object]) -> bool:
        """True when ``call`` finds ``what``, False on NotFound."""
        try:
            self._call(what, call)
        except gexc.NotFound:
            return False
        return True

    def _create(self, what: str, call: Callable[[], object]) -> None:
        # AlreadyExists: created meanwhile (another replica's init); the next run compares it.
        with contextlib.suppress(gexc.AlreadyExists):
            self._call(what, call)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except (gexc.NotFound, gexc.AlreadyExists):
            raise
        except (gexc.RetryError, gexc.ServiceUnavailable, gexc.DeadlineExceeded) as exc:
            raise AdminUnreachable(
                f"Pub/Sub at {self._address} did not answer within {self._timeout_s:g} s "
                f"({what}): {exc}"
            ) from exc
        except gexc.GoogleAPICallError as exc:
            raise AdminFailed(f"Pub/Sub at {self._address} refused ({what}): {exc}") from exc


def _subscription(spec: SubscriptionSpec) -> pstypes.Subscription:
    sub = pstypes.Subscription(name=spec.name, topic=spec.topic)
    if spec.ack_deadline_s is not None:
        sub.ack_deadline_seconds = spec.ack_deadline_s
    if spec.retry_backoff_s is not None:
        low, high = spec.retry_backoff_s
        sub.retry_policy = pstypes.RetryPolicy(
            minimum_backoff=timedelta(seconds=low), maximum_backoff=timedelta(seconds=high)
        )
    if spec.dead_letter_topic is not None:
        sub.dead_letter_policy = pstypes.DeadLetterPolicy(
            dead_letter_topic=spec.dead_letter_topic,
            max_delivery_attempts=spec.max_delivery_attempts or 5,
        )
    return sub


def _state(sub: Any) -> SubscriptionState:
    raw = pstypes.Subscription.pb(sub)
    retry: tuple[float, float] | None = None
    if raw.HasField("retry_policy"):
        policy = raw.retry_policy
        retry = (
            policy.minimum_backoff.ToTimedelta().total_seconds(),
            policy.maximum_backoff.ToTimedelta().total_seconds(),
        )
    dead_topic: str | None = None
    attempts: int | None = None
    if raw.HasField("dead_letter_policy") and raw.dead_letter_policy.dead_letter_topic:
        dead_topic = raw.dead_letter_policy.dead_letter_topic
        attempts = raw.dead_letter_policy.max_delivery_attempts
    return SubscriptionState(
        name=raw.name,
        topic=raw.topic,
        ack_deadline_s=raw.ack_deadline_seconds,
        retry_backoff_s=retry,
        dead_letter_topic=dead_topic,
        max_delivery_attempts=attempts,
    )
