"""DescribeShareGroupOffsets v1 over aiokafka's client (``share_offsets``): the request aiokafka
frames is byte for byte the one the harness used to write by hand (fixed bytes below, taken
from that encoder before it was deleted, three of them sent to a Kafka 4.4.0 broker), the
broker's answers to those three decode to the offsets it reported, errors read as names, a
coordinator that moved is looked up once more, and the reader makes, keeps and closes its
client."""

from __future__ import annotations

from io import BytesIO
from typing import Any

import pytest
from aiokafka.errors import (
    CoordinatorNotAvailableError,
    IncompatibleBrokerVersion,
    KafkaConnectionError,
)

from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.kafka_share.share_offsets import (
    API_KEY,
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest_v1,
    DescribeShareGroupOffsetsResponse_v1,
    ShareOffsetsError,
    ShareOffsetsReader,
    SharePartitionOffset,
    Topics,
    Uuid,
    describe_share_group_offsets,
    error_text,
    offsets_of,
)

VERSIONS = {API_KEY: (0, 1)}
"""What a Kafka 4.2+ broker advertises for the API."""
CLIENT_ID = "rowbatch-harness"

# (correlation id, group, topics, the request the harness's own encoder wrote, the broker's
# response to it: correlation id and header tags first). The first three went to a Kafka
# 4.4.0 share broker: a group whose records lost their lock once (start 0, lag 20 of 20), a
# group that does not exist (no partitions), a group with two partitions done and one it has
# written no state of (-1, -1).
SENT = [
    (
        7,
        "g-exp-28cfde",
        {"exp-28cfde": [0]},
        "005a0001000000070010726f7762617463682d6861726e65737300020d672d6578702d323863666465020b"
        "6578702d3238636664650200000000000000",
        "000000070000000000020d672d6578702d323863666465020b6578702d3238636664659cf860e9b0b94a33"
        "90d78d9465b98e3b0200000000000000000000000000000000000000000000001400000000000000000000",
    ),
    (
        8,
        "g-nope",
        None,
        "005a0001000000080010726f7762617463682d6861726e657373000207672d6e6f7065000000",
        "0000000800000000000207672d6e6f7065010000000000",
    ),
    (
        9,
        "g-exp-9927c1",
        {"exp-9927c1": [0, 1, 2]},
        "005a0001000000090010726f7762617463682d6861726e65737300020d672d6578702d393932376331020b"
        "6578702d39393237633104000000000000000100000002000000",
        "000000090000000000020d672d6578702d393932376331020b6578702d39393237633154ddf2f42b77427b"
        "9d335af0587d6a8b04000000000000000000000005000000000000000000000000000000000000000100"
        "000000000000050000000000000000000000000000000000000002ffffffffffffffff00000000ffffff"
        "ffffffffff00000000000000000000",
    ),
]
ANSWERED = {
    "g-exp-28cfde": {("exp-28cfde", 0): SharePartitionOffset(0, 0, 20)},
    "g-nope": {},
    "g-exp-9927c1": {
        ("exp-9927c1", 0): SharePartitionOffset(5, 0, 0),
        ("exp-9927c1", 1): SharePartitionOffset(5, 0, 0),
        ("exp-9927c1", 2): SharePartitionOffset(-1, 0, -1),
    },
}
# Two more requests of the old encoder: two topics (one with no partitions), a one-letter group.
ENCODED = [
    (
        1,
        "group-a",
        {"topic-x": [0, 1, 2], "topic-y": []},
        "005a0001000000010010726f7762617463682d6861726e65737300020867726f75702d610308746f7069"
        "632d78040000000000000001000000020008746f7069632d7901000000",
    ),
    (2, "g", None, "005a0001000000020010726f7762617463682d6861726e65737300020267000000"),
]


def framed(correlation: int, group: str, topics: Topics | None) -> bytes:
    """What aiokafka's connection writes for the request (less the size): header v2, body."""
    struct = DescribeShareGroupOffsetsRequest(group, topics).prepare(VERSIONS)
    assert isinstance(struct, DescribeShareGroupOffsetsRequest_v1)
    header = struct.build_request_header(correlation_id=correlation, client_id=CLIENT_ID)
    return bytes(header.encode() + struct.encode())


@pytest.mark.parametrize(
    ("correlation", "group", "topics", "want"),
    [(c, g, t, req) for c, g, t, req, _ in SENT] + ENCODED,
)
def test_the_request_is_the_harness_s_bytes(
    correlation: int, group: str, topics: Topics | None, want: str
) -> None:
    assert framed(correlation, group, topics).hex() == want


def decode(correlation: int, hex_response: str) -> Any:
    """What aiokafka's connection does with a response: its header (v1, flexible), then the
    body, every byte read."""
    struct = DescribeShareGroupOffsetsRequest("g").prepare(VERSIONS)
    data = BytesIO(bytes.fromhex(hex_response))
    assert struct.parse_response_header(data).correlation_id == correlation
    response = struct.RESPONSE_TYPE.decode(data)
    assert data.read() == b"", "bytes left after the response"
    return response


@pytest.mark.parametrize(
    ("correlation", "group", "response"), [(c, g, r) for c, g, _, _, r in SENT]
)
def test_the_broker_s_answers_decode(correlation: int, group: str, response: str) -> None:
    decoded = decode(correlation, response)
    assert decoded.throttle_time_ms == 0
    assert [g[0] for g in decoded.groups] == [group]
    assert offsets_of(decoded, group) == ANSWERED[group]


def test_a_topic_id_is_sixteen_bytes() -> None:
    decoded = decode(7, SENT[0][4])
    (_, topics, *_), *_ = decoded.groups
    assert topics[0][1] == bytes.fromhex("9cf860e9b0b94a3390d78d9465b98e3b")
    assert Uuid.encode(topics[0][1]) == topics[0][1]
    with pytest.raises(ValueError, match="16 bytes"):
        Uuid.encode(b"short")
    with pytest.raises(ValueError, match="underrun"):
        Uuid.decode(BytesIO(b"\x00" * 15))


def test_unknown_is_not_a_lag() -> None:
    assert SharePartitionOffset(-1, 0, -1).known_lag is None
    assert SharePartitionOffset(3, 0, 0).known_lag == 0


# --- responses built with the response struct ---------------------------------------------------


def partition(
    index: int, start: int = 0, lag: int = 0, code: int = 0, message: str | None = None
) -> tuple[Any, ...]:
    return (index, start, 0, lag, code, message, {})


def response(
    *partitions: tuple[Any, ...],
    group: str = "g",
    topic: str = "t",
    code: int = 0,
    message: str | None = None,
) -> Any:
    """A decoded response with one group: one topic of ``partitions``, or none."""
    topics: list[Any] = [(topic, b"\x01" * 16, list(partitions), {})] if partitions else []
    built = DescribeShareGroupOffsetsResponse_v1(0, [(group, topics, code, message, {})], {})
    # through the bytes, as from a broker
    return DescribeShareGroupOffsetsResponse_v1.decode(built.encode())


def test_errors_read_as_names() -> None:
    assert error_text(16) == (
        "NOT_COORDINATOR (error 16): the broker is no longer the group's coordinator"
    )
    assert error_text(30, "denied") == (
        "GROUP_AUTHORIZATION_FAILED (error 30): the client may not DESCRIBE the group (an ACL) "
        "[broker: denied]"
    )
    assert error_text(9999) == "UNKNOWN (error 9999)"


def test_a_group_error_names_the_group() -> None:
    with pytest.raises(ShareOffsetsError, match=r"'g': GROUP_ID_NOT_FOUND \(error 69\)"):
        offsets_of(response(code=69), "g")


def test_partition_errors_are_named_each() -> None:
    answer = response(partition(0, 4, 2), partition(1, code=3), partition(2, code=29, message="no"))
    with pytest.raises(ShareOffsetsError) as caught:
        offsets_of(answer, "g")
    text = str(caught.value)
    assert "t-1: UNKNOWN_TOPIC_OR_PARTITION (error 3)" in text
    assert "t-2: TOPIC_AUTHORIZATION_FAILED (error 29)" in text
    assert "[broker: no]" in text


# --- the call: coordinator lookup, send, one more try -----------------------------------------


class FakeClient:
    """``coordinator_lookup`` and ``send`` of aiokafka's client: each answer in turn (a
    response, or an exception to raise); ``send`` negotiates the version as a connection
    does, with the broker's ``versions``."""

    def __init__(
        self,
        answers: list[Any],
        *,
        lookups: list[Any] | None = None,
        versions: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.answers = answers
        self.lookup_answers = lookups or []
        self.versions = VERSIONS if versions is None else versions
        self.looked_up: list[tuple[int, str]] = []
        self.sent: list[tuple[int, Any]] = []

    async def coordinator_lookup(self, coordinator_type: int, coordinator_key: str) -> int:
        self.looked_up.append((coordinator_type, coordinator_key))
        answer = self.lookup_answers.pop(0) if self.lookup_answers else 1
        if isinstance(answer, BaseException):
            raise answer
        return int(answer)

    async def send(self, node_id: int, request: Any) -> Any:
        struct = request.prepare(self.versions)
        self.sent.append((node_id, struct))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def test_the_request_goes_to_the_group_s_coordinator() -> None:
    client = FakeClient([response(partition(0, 10, 3), group="scorers")], lookups=[7])
    offsets = await describe_share_group_offsets(client, "scorers", {"t": [0]})
    assert offsets == {("t", 0): SharePartitionOffset(10, 0, 3)}
    assert client.looked_up == [(0, "scorers")]  # CoordinationType.GROUP
    (node, struct), *_ = client.sent
    assert node == 7
    assert struct.API_VERSION == 1
    assert struct.groups == [("scorers", [("t", [0], {})], {})]


@pytest.mark.parametrize("code", [14, 15, 16])
async def test_a_moved_coordinator_is_looked_up_once_more(code: int) -> None:
    client = FakeClient([response(code=code), response(partition(0, 1, 1))], lookups=[1, 2])
    assert await describe_share_group_offsets(client, "g") == {
        ("t", 0): SharePartitionOffset(1, 0, 1)
    }
    assert [node for node, _ in client.sent] == [1, 2]


async def test_a_coordinator_moved_twice_is_an_error() -> None:
    client = FakeClient([response(code=16), response(code=16)])
    with pytest.raises(ShareOffsetsError, match=r"NOT_COORDINATOR \(error 16\)"):
        await describe_share_group_offsets(client, "g")
    assert len(client.looked_up) == 2


async def test_an_other_group_error_is_not_tried_again() -> None:
    client = FakeClient([response(code=30)])
    with pytest.raises(ShareOffsetsError, match="GROUP_AUTHORIZATION_FAILED"):
        await describe_share_group_offsets(client, "g")
    assert len(client.sent) == 1


async def test_a_failed_lookup_is_tried_once_more() -> None:
    client = FakeClient([response(partition(0))], lookups=[CoordinatorNotAvailableError(), 2])
    assert await describe_share_group_offsets(client, "g") == {
        ("t", 0): SharePartitionOffset(0, 0, 0)
    }
    assert len(client.looked_up) == 2
    assert [node for node, _ in client.sent] == [2]


async def test_a_failed_connection_is_tried_once_more_after_a_lookup() -> None:
    client = FakeClient([KafkaConnectionError("gone"), response(partition(0))], lookups=[1, 2])
    assert await describe_share_group_offsets(client, "g") == {
        ("t", 0): SharePartitionOffset(0, 0, 0)
    }
    assert [node for node, _ in client.sent] == [1, 2]


async def test_one_more_try_in_all() -> None:
    client = FakeClient([KafkaConnectionError("gone")], lookups=[CoordinatorNotAvailableError()])
    with pytest.raises(ShareOffsetsError, match="to broker 1: KafkaConnectionError: gone"):
        await describe_share_group_offsets(client, "g")


async def test_a_lookup_failing_twice_names_the_error() -> None:
    client = FakeClient(
        [], lookups=[CoordinatorNotAvailableError(), CoordinatorNotAvailableError()]
    )
    with pytest.raises(ShareOffsetsError, match=r"coordinator of share group 'g': COORDINATOR_NOT"):
        await describe_share_group_offsets(client, "g")


@pytest.mark.parametrize(
    "versions",
    [{}, {API_KEY: (0, 0)}],
    ids=["no API 90 (share groups off, Kafka < 4.1)", "v0 only (Kafka 4.1)"],
)
async def test_a_broker_without_v1_is_named(versions: dict[int, tuple[int, int]]) -> None:
    client = FakeClient([], versions=versions)
    with pytest.raises(ShareOffsetsError, match=r"Kafka >= 4\.2") as caught:
        await describe_share_group_offsets(client, "g")
    assert isinstance(caught.value.__cause__, IncompatibleBrokerVersion | NotImplementedError)


# --- the reader: its client -------------------------------------------------------------------


class FakeCluster:
    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic)


class FakeAIOClient(FakeClient):
    """The rest of ``AIOKafkaClient`` the reader uses."""

    def __init__(self, answers: list[Any], **options: Any) -> None:
        super().__init__(answers)
        self.options = options
        self.bootstrap_error: BaseException | None = None
        self.closed = False
        self.cluster = FakeCluster({"t": {1, 0}})
        self.metadata_updates = 0

    async def bootstrap(self) -> None:
        if self.bootstrap_error is not None:
            raise self.bootstrap_error

    async def close(self) -> None:
        self.closed = True

    async def add_topic(self, topic: str) -> bool:
        return True

    async def force_metadata_update(self) -> bool:
        self.metadata_updates += 1
        return True


def factory(answers: list[Any], bootstrap_error: BaseException | None = None) -> Any:
    made: list[FakeAIOClient] = []

    def make(**options: Any) -> FakeAIOClient:
        client = FakeAIOClient(answers, **options)
        client.bootstrap_error = bootstrap_error if not made else None
        made.append(client)
        return client

    make.made = made  # type: ignore[attr-defined]
    return make


async def test_the_reader_keeps_its_client_and_closes_it() -> None:
    make = factory([response(partition(0)), response(partition(0, 2, 0))])
    reader = ShareOffsetsReader(
        {"bootstrap_servers": "b:1"}, "g", request_timeout_s=2.5, client_factory=make
    )
    assert await reader.partitions("t") == [0, 1]
    await reader.read({"t": [0]})
    assert await reader.read() == {("t", 0): SharePartitionOffset(2, 0, 0)}
    (client,) = make.made
    assert client.options == {"bootstrap_servers": "b:1", "request_timeout_ms": 2500}
    await reader.close()
    assert client.closed
    await reader.close()  # twice is fine


async def test_a_failed_bootstrap_is_an_error_and_tried_again_next_read() -> None:
    make = factory([response(partition(0))], bootstrap_error=KafkaConnectionError("refused"))
    reader = ShareOffsetsReader({"bootstrap_servers": "b:1"}, "g", client_factory=make)
    with pytest.raises(ShareOffsetsError, match=r"cannot reach Kafka at b:1: .*refused"):
        await reader.read()
    assert make.made[0].closed
    assert await reader.read() == {("t", 0): SharePartitionOffset(0, 0, 0)}
    assert len(make.made) == 2


async def test_a_topic_not_in_the_metadata_is_named() -> None:
    make = factory([])
    reader = ShareOffsetsReader({"bootstrap_servers": "b:1"}, "g", client_factory=make)
    with pytest.raises(ShareOffsetsError, match="topic 'other' is not in the cluster"):
        await reader.partitions("other")
    assert make.made[0].metadata_updates == 1


async def test_the_reader_of_the_source_takes_its_brokers_and_security() -> None:
    settings = KafkaShareSettings(
        bootstrap_servers="k:9093",
        topic="t",
        group_id="scorers",
        client_id="me",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="u",
        sasl_plain_password="pw",  # type: ignore[arg-type]
    )
    make = factory([response(partition(0), group="scorers")])
    reader = ShareOffsetsReader.for_settings(settings, request_timeout_s=1.0, client_factory=make)
    await reader.read({"t": [0]})
    assert reader.group == "scorers"
    assert make.made[0].options == {
        "bootstrap_servers": "k:9093",
        "client_id": "me",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "pw",
        "request_timeout_ms": 1000,
    }
