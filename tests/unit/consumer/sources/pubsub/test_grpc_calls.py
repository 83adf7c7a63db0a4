"""The pull source's own Pub/Sub calls (``wire_types``, ``grpc_calls``, ``calls.retried``) and
the start-up check over them: the messages are google-cloud-pubsub's on the wire (checked
against the library's types both ways), and ``GrpcCalls`` against an in-process gRPC server on
127.0.0.1 that reads and answers with the library's own types: what arrives, the routing
header, and errors as ``google.api_core.exceptions``. No real time passes in the retry tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.protobuf.empty_pb2 import Empty
from google.pubsub_v1 import types as lib

from rowbatch.consumer.sources.pubsub import wire_types as wt
from rowbatch.consumer.sources.pubsub.calls import SubscriptionInfo, retried
from rowbatch.consumer.sources.pubsub.errors import (
    PubSubConfigError,
    PubSubCredentialsError,
    PubSubUnreachable,
)
from rowbatch.consumer.sources.pubsub.grpc_calls import GrpcCalls, open_channel
from rowbatch.consumer.sources.pubsub.startup_check import check_subscription
from tests.virtual_time import VirtualTime

SUB = "projects/p/subscriptions/s-1"


def err(kind: type[Exception], text: str) -> Exception:
    return kind(text)


TOPIC = "projects/p/topics/dlq"


def test_a_pull_response_of_the_library_reads_field_for_field() -> None:
    message = lib.PubsubMessage(
        data=b"\x00rows", attributes={"a": "1", "data": "x"}, message_id="42", ordering_key="k"
    )
    message.publish_time = datetime(2026, 12, 5, 1, 2, 3, 456000, tzinfo=UTC)
    response = lib.PullResponse(
        received_messages=[lib.ReceivedMessage(ack_id="ack-1", message=message, delivery_attempt=3)]
    )
    [got] = wt.PullResponse.FromString(lib.PullResponse.serialize(response)).received_messages
    assert (got.ack_id, got.delivery_attempt) == ("ack-1", 3)
    m = got.message
    assert (m.data, dict(m.attributes), m.message_id, m.ordering_key) == (
        b"\x00rows",
        {"a": "1", "data": "x"},
        "42",
        "k",
    )
    stamp = m.publish_time
    assert stamp.seconds + stamp.nanos / 1e9 == pytest.approx(message.publish_time.timestamp())
    assert m.ByteSize() == lib.PubsubMessage.pb(message).ByteSize()


def test_the_requests_read_back_as_the_librarys() -> None:
    def back(ours: Any, theirs: Any) -> Any:
        return theirs.deserialize(ours.SerializeToString())

    pull = back(wt.PullRequest(subscription=SUB, max_messages=64), lib.PullRequest)
    assert (pull.subscription, pull.max_messages) == (SUB, 64)
    ack = back(wt.AcknowledgeRequest(subscription=SUB, ack_ids=["a", "b"]), lib.AcknowledgeRequest)
    assert (ack.subscription, list(ack.ack_ids)) == (SUB, ["a", "b"])
    modify = back(
        wt.ModifyAckDeadlineRequest(subscription=SUB, ack_ids=["a"], ack_deadline_seconds=30),
        lib.ModifyAckDeadlineRequest,
    )
    assert (list(modify.ack_ids), modify.ack_deadline_seconds) == (["a"], 30)
    message = wt.PubsubMessage(data=b"p", attributes={"k": "v"})
    publish = back(wt.PublishRequest(topic=TOPIC, messages=[message]), lib.PublishRequest)
    assert publish.topic == TOPIC
    assert (publish.messages[0].data, dict(publish.messages[0].attributes)) == (b"p", {"k": "v"})
    assert (
        back(wt.GetSubscriptionRequest(subscription=SUB), lib.GetSubscriptionRequest).subscription
        == SUB
    )
    assert back(wt.GetTopicRequest(topic=TOPIC), lib.GetTopicRequest).topic == TOPIC


def test_a_subscription_keeps_what_the_sources_read_and_skips_the_rest() -> None:
    full = lib.Subscription(
        name=SUB,
        topic="projects/p/topics/in",
        ack_deadline_seconds=45,
        enable_message_ordering=True,
        dead_letter_policy=lib.DeadLetterPolicy(dead_letter_topic=TOPIC, max_delivery_attempts=7),
        labels={"team": "ml"},
        filter='attributes.kind = "a"',
        retain_acked_messages=True,
    )
    got = wt.Subscription.FromString(lib.Subscription.serialize(full))
    assert (got.name, got.ack_deadline_seconds, got.enable_message_ordering) == (SUB, 45, True)
    policy = got.dead_letter_policy
    assert (policy.dead_letter_topic, policy.max_delivery_attempts) == (TOPIC, 7)


# -- GrpcCalls against an in-process server ---------------------------------------------------


def serialized(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


class Server:
    """Subscriber and Publisher methods answering with the library's types; records each
    request (as the library's type) and its metadata; ``fail`` maps a method to a status."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any, dict[str, str]]] = []
        self.fail: dict[str, grpc.StatusCode] = {}
        self.answers: dict[str, Any] = {}

    def handler(self, service: str, methods: dict[str, tuple[Any, Any]]) -> Any:
        def make(name: str, request_type: Any, response_type: Any) -> Any:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                self.requests.append((name, request, dict(context.invocation_metadata() or ())))
                if name in self.fail:
                    await context.abort(self.fail[name], f"{name} refused")
                return self.answers.get(name, response_type())

            return grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=request_type.deserialize,
                response_serializer=getattr(response_type, "serialize", serialized),
            )

        return grpc.method_handlers_generic_handler(
            service, {name: make(name, *types) for name, types in methods.items()}
        )


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, GrpcCalls]]:
    state = Server()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            state.handler(
                "google.pubsub.v1.Subscriber",
                {
                    "Pull": (lib.PullRequest, lib.PullResponse),
                    "Acknowledge": (lib.AcknowledgeRequest, Empty),
                    "ModifyAckDeadline": (lib.ModifyAckDeadlineRequest, Empty),
                    "GetSubscription": (lib.GetSubscriptionRequest, lib.Subscription),
                },
            ),
            state.handler(
                "google.pubsub.v1.Publisher",
                {
                    "Publish": (lib.PublishRequest, lib.PublishResponse),
                    "GetTopic": (lib.GetTopicRequest, lib.Topic),
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    calls = GrpcCalls("p", channel=channel)
    try:
        yield state, calls
    finally:
        await calls.close()
        await channel.close()
        await server.stop(None)


async def test_each_call_arrives_as_the_library_reads_it_with_its_routing_header(
    served: tuple[Server, GrpcCalls],
) -> None:
    state, calls = served
    message = lib.PubsubMessage(data=b"row", message_id="9")
    state.answers["Pull"] = lib.PullResponse(
        received_messages=[lib.ReceivedMessage(ack_id="x", message=message)]
    )
    state.answers["GetSubscription"] = lib.Subscription(
        name=SUB,
        ack_deadline_seconds=20,
        dead_letter_policy=lib.DeadLetterPolicy(dead_letter_topic=TOPIC, max_delivery_attempts=5),
    )
    [received] = await calls.pull(SUB, 10, 5.0)
    assert (received.ack_id, received.message.data) == ("x", b"row")
    await calls.acknowledge(SUB, ["x"], 5.0)
    await calls.modify_ack_deadline(SUB, ["y"], 0, 5.0)
    info = await calls.get_subscription(SUB, 5.0)
    assert info == SubscriptionInfo(20, False, TOPIC, 5)
    await calls.get_topic(TOPIC, 5.0)
    await calls.publish(TOPIC, b"poison", {"data": "x", "rowbatch-dlq-reason": "decode"}, 5.0)

    by_name = {name: (request, metadata) for name, request, metadata in state.requests}
    assert by_name["Pull"][0].max_messages == 10
    assert list(by_name["Acknowledge"][0].ack_ids) == ["x"]
    assert (
        list(by_name["ModifyAckDeadline"][0].ack_ids),
        by_name["ModifyAckDeadline"][0].ack_deadline_seconds,
    ) == (["y"], 0)
    published = by_name["Publish"][0]
    assert published.topic == TOPIC
    assert dict(published.messages[0].attributes) == {"data": "x", "rowbatch-dlq-reason": "decode"}
    assert published.messages[0].data == b"poison"
    for name in ("Pull", "Acknowledge", "ModifyAckDeadline", "GetSubscription"):
        assert by_name[name][1]["x-goog-request-params"] == f"subscription={SUB}"
    for name in ("Publish", "GetTopic"):
        assert by_name[name][1]["x-goog-request-params"] == f"topic={TOPIC}"


async def test_a_status_becomes_the_google_api_core_exception(
    served: tuple[Server, GrpcCalls],
) -> None:
    state, calls = served
    state.fail = {"GetTopic": grpc.StatusCode.NOT_FOUND, "Pull": grpc.StatusCode.UNAVAILABLE}
    with pytest.raises(gexc.NotFound, match="GetTopic refused"):
        await calls.get_topic(TOPIC, 5.0)
    with pytest.raises(gexc.ServiceUnavailable):
        await calls.pull(SUB, 1, 5.0)


# -- retries and the start-up check ----------------------------------------------------------


def failing(errors: list[Exception], result: str = "ok") -> Callable[[], Any]:
    async def call() -> str:
        if errors:
            raise errors.pop(0)
        return result

    return call


async def test_retried_waits_doubling_and_returns_once_the_call_answers() -> None:
    ticks = VirtualTime()
    errors: list[Exception] = [err(gexc.ServiceUnavailable, "a"), err(gexc.ServiceUnavailable, "b")]
    got = await retried(
        failing(errors),
        retry_on=(gexc.ServiceUnavailable,),
        timeout_s=10.0,
        max_wait_s=1.0,
        clock=ticks.clock,
        sleep=ticks.sleep,
    )
    assert got == "ok"
    assert ticks.slept == [0.1, 0.2]


async def test_retried_gives_up_with_the_last_error_at_the_timeout() -> None:
    ticks = VirtualTime()
    errors: list[Exception] = [err(gexc.ServiceUnavailable, str(i)) for i in range(100)]
    with pytest.raises(gexc.ServiceUnavailable) as raised:
        await retried(
            failing(errors),
            retry_on=(gexc.ServiceUnavailable,),
            timeout_s=3.0,
            max_wait_s=1.0,
            clock=ticks.clock,
            sleep=ticks.sleep,
        )
    assert ticks.slept == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert str(raised.value).endswith(str(len(ticks.slept)))


async def test_retried_does_not_retry_other_errors() -> None:
    ticks = VirtualTime()
    with pytest.raises(gexc.PermissionDenied):
        await retried(
            failing([err(gexc.PermissionDenied, "no")]),
            retry_on=(gexc.ServiceUnavailable,),
            timeout_s=10.0,
            max_wait_s=1.0,
            clock=ticks.clock,
            sleep=ticks.sleep,
        )
    assert ticks.slept == []


class Lookups:
    def __init__(self, subscription: Exception | SubscriptionInfo, topic: Exception | None) -> None:
        self._subscription = subscription
        self._topic = topic

    async def get_subscription(self, subscription: str, timeout_s: float) -> SubscriptionInfo:
        if isinstance(self._subscription, Exception):
            raise self._subscription
        return self._subscription

    async def get_topic(self, topic: str, timeout_s: float) -> None:
        if self._topic is not None:
            raise self._topic

    async def publish(self, topic: str, data: bytes, attributes: Any, timeout_s: float) -> None:
        raise AssertionError("the check publishes nothing")

    async def close(self) -> None:
        pass


async def check(calls: Lookups, dead_letter_topic: str | None = TOPIC) -> SubscriptionInfo:
    return await check_subscription(
        calls,
        subscription=SUB,
        dead_letter_topic=dead_letter_topic,
        max_delivery_attempts=None,
        host="127.0.0.1:1",
        timeout=0.0,
    )


async def test_the_check_names_what_is_missing_or_unreachable() -> None:
    found = SubscriptionInfo(10, False, "", 0)
    assert await check(Lookups(found, None)) == found
    with pytest.raises(PubSubConfigError, match=f"subscription {SUB} does not exist"):
        await check(Lookups(err(gexc.NotFound, "no"), None))
    with pytest.raises(PubSubConfigError, match=f"dead-letter topic {TOPIC} does not exist"):
        await check(Lookups(found, err(gexc.NotFound, "no")))
    with pytest.raises(PubSubUnreachable, match="did not answer"):
        await check(Lookups(err(gexc.ServiceUnavailable, "down"), None))
    with pytest.raises(PubSubConfigError, match="no dead_letter_topic configured"):
        await check(Lookups(found, None), dead_letter_topic=None)


# -- the channel -------------------------------------------------------------------------------


async def test_without_the_emulator_the_channel_is_googles_with_default_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    asked: list[Any] = []

    def default(*args: Any, **kwargs: Any) -> tuple[AnonymousCredentials, str]:
        asked.append(kwargs)
        return AnonymousCredentials(), "p"  # type: ignore[no-untyped-call]

    monkeypatch.setattr(google.auth, "default", default)
    channel = open_channel("p")
    try:
        assert isinstance(channel, grpc.aio.Channel)
        assert asked and "https://www.googleapis.com/auth/pubsub" in asked[0]["default_scopes"]
    finally:
        await channel.close()


async def test_without_the_emulator_or_credentials_the_error_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)

    def default(*args: Any, **kwargs: Any) -> Any:
        raise err(DefaultCredentialsError, "Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", default)
    with pytest.raises(PubSubCredentialsError, match="PUBSUB_EMULATOR_HOST"):
        open_channel("p")
