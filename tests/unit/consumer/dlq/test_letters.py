"""``DeadLetter``: the fields read leniently from a dead letter's attributes (a missing or
malformed one shows as ``unknown`` / None), a message Pub/Sub's own dead-letter policy moved,
and what a replay publishes (the dead-letter attributes removed, the replay recorded; Kafka
headers byte for byte). Also the Kafka queue's pure helpers that turn a record into a letter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from rowbatch.consumer.dlq.kafka_queue import MARKER, MARKER_AS, letter_of, marker_of, ref_of
from rowbatch.consumer.dlq.letters import (
    POLICY_CODE,
    REPLAY_COUNT,
    REPLAYED_FROM,
    UNKNOWN,
    DeadLetter,
    text_of,
)

PRODUCER = {
    "rowbatch-format-version": "1",
    "content-type": "application/json",
    "rowbatch-chunk-id": "c1",
    "rowbatch-table": "docs",
    "rowbatch-row-count": "3",
    "rowbatch-produced-at": "2026-12-01T08:00:00.000Z",
    "team": "search",
}
"""What a producer sent (plus one attribute of its own)."""

DLQ = {
    "rowbatch-dlq-reason": "rejected-by-model",
    "rowbatch-dlq-code": "invalid_argument",
    "rowbatch-dlq-message": "row 2: bad value",
    "rowbatch-dlq-source": "projects/p/subscriptions/rows",
    "rowbatch-dlq-message-id": "m-17",
    "rowbatch-dlq-delivery-attempt": "2",
    "rowbatch-dlq-consumer-version": "1.4.0",
    "rowbatch-dlq-time": "2026-12-02T09:30:00.250Z",
}
"""What the consumer added when it dead-lettered it."""

POLICY = {
    "CloudPubSubDeadLetterSourceSubscription": "projects/p/subscriptions/rows",
    "CloudPubSubDeadLetterSourceDeliveryCount": "5",
    "CloudPubSubDeadLetterSourceTopicPublishTime": "2026-12-02T09:00:00Z",
    "CloudPubSubDeadLetterSourceSubscriptionProject": "p",
}
"""What Pub/Sub adds when a subscription's dead-letter policy moves a message."""


def letter(attributes: dict[str, str], queued_at: datetime | None = None) -> DeadLetter:
    return DeadLetter(
        ref="projects/p/subscriptions/rows-dlq/m-9",
        payload=b"{}",
        attributes=attributes,
        queued_at=queued_at,
    )


# --- fields -------------------------------------------------------------------------------


def test_fields_of_a_letter_the_consumer_dead_lettered() -> None:
    got = letter({**PRODUCER, **DLQ})
    assert not got.moved_by_policy
    assert got.reason == "rejected-by-model"
    assert got.code == "invalid_argument"
    assert got.message == "row 2: bad value"
    assert got.source == "projects/p/subscriptions/rows"
    assert got.message_id == "m-17"
    assert got.delivery_attempt == 2
    assert got.consumer_version == "1.4.0"
    assert got.time == datetime(2026, 12, 2, 9, 30, 0, 250_000, tzinfo=UTC)
    assert got.table == "docs"
    assert got.chunk_id == "c1"
    assert got.row_count == 3
    assert got.replays == 0


def test_a_letter_with_no_attributes_reads_as_unknown() -> None:
    got = letter({})
    assert not got.moved_by_policy
    for value in (
        got.reason,
        got.code,
        got.source,
        got.message_id,
        got.consumer_version,
        got.table,
        got.chunk_id,
    ):
        assert value == UNKNOWN
    assert got.message == ""
    assert got.delivery_attempt is None
    assert got.row_count is None
    assert got.time is None
    assert got.replays == 0


def test_malformed_fields_read_as_unknown_or_none() -> None:
    got = letter(
        {
            "rowbatch-dlq-reason": "",
            "rowbatch-dlq-code": "",
            "rowbatch-dlq-delivery-attempt": "two",
            "rowbatch-dlq-time": "yesterday",
            "rowbatch-row-count": "-3",
            REPLAY_COUNT: "many",
        }
    )
    assert got.reason == UNKNOWN
    assert got.code == UNKNOWN
    assert got.delivery_attempt is None
    assert got.time is None
    assert got.row_count is None
    assert got.replays == 0


def test_non_ascii_digits_are_not_a_number() -> None:
    assert letter({"rowbatch-row-count": "\uff13"}).row_count is None  # fullwidth 3
    assert letter({"rowbatch-row-count": " 3"}).row_count is None


def test_time_falls_back_to_the_queue_time_when_missing_or_malformed() -> None:
    queued = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert letter({}, queued_at=queued).time == queued
    assert letter({"rowbatch-dlq-time": "not a time"}, queued_at=queued).time == queued
    consumer_time = letter({"rowbatch-dlq-time": "2026-12-02T09:00:00Z"}, queued_at=queued).time
    assert consumer_time == datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def test_chunk_header_names_match_case_insensitively() -> None:
    got = letter({"Rowbatch-Table": "docs", "ROWBATCH-CHUNK-ID": "c9", "rowbatch-Row-Count": "4"})
    assert got.table == "docs"
    assert got.chunk_id == "c9"
    assert got.row_count == 4


def test_an_exact_header_name_wins_over_another_case() -> None:
    got = letter({"ROWBATCH-TABLE": "other", "rowbatch-table": "docs"})
    assert got.table == "docs"


# --- moved by Pub/Sub's dead-letter policy ----------------------------------------------------


def test_a_message_moved_by_a_pubsub_policy_reads_as_too_many_attempts() -> None:
    got = letter({**PRODUCER, **POLICY})
    assert got.moved_by_policy
    assert got.reason == "too-many-attempts"
    assert got.code == POLICY_CODE == "subscription_dead_letter_policy"
    assert got.source == "projects/p/subscriptions/rows"
    assert got.delivery_attempt == 5
    assert got.table == "docs"


def test_a_rowbatch_reason_wins_over_the_policy_attributes() -> None:
    got = letter({**PRODUCER, **POLICY, **DLQ})
    assert not got.moved_by_policy
    assert got.reason == "rejected-by-model"
    assert got.code == "invalid_argument"
    assert got.delivery_attempt == 2


# --- replay attributes (Pub/Sub) --------------------------------------------------------------


def test_replay_attributes_drop_the_dead_letter_ones_and_record_the_replay() -> None:
    got = letter({**PRODUCER, **DLQ, **POLICY, "Rowbatch-DLQ-Extra": "x"})
    assert got.original_attributes() == PRODUCER
    assert got.replay_attributes() == {
        **PRODUCER,
        REPLAYED_FROM: "projects/p/subscriptions/rows-dlq/m-9",
        REPLAY_COUNT: "1",
    }


def test_replay_count_increments_from_the_existing_value() -> None:
    got = letter({**PRODUCER, **DLQ, REPLAYED_FROM: "an/earlier/place", REPLAY_COUNT: "2"})
    assert got.replays == 2
    attributes = got.replay_attributes()
    assert attributes[REPLAY_COUNT] == "3"
    assert attributes[REPLAYED_FROM] == got.ref
    assert {k for k in attributes if k.startswith("rowbatch-dlq-")} == set()


def test_a_malformed_replay_count_starts_again_at_one() -> None:
    assert letter({REPLAY_COUNT: "x"}).replay_attributes()[REPLAY_COUNT] == "1"


# --- Kafka records and replay headers ---------------------------------------------------------


@dataclass
class Record:
    """The fields of an aiokafka ConsumerRecord the helpers read."""

    topic: str = "rows.dlq"
    partition: int = 1
    offset: int = 42
    key: bytes | None = b"k1"
    value: bytes | None = b"payload"
    timestamp: int | None = 1_796_198_400_000  # 2026-12-02T08:00:00Z
    headers: tuple[tuple[str, bytes | None], ...] | None = ()


def test_ref_and_letter_of_a_kafka_record() -> None:
    record = Record(headers=(("rowbatch-table", b"docs"), ("rowbatch-dlq-reason", b"undecodable")))
    assert ref_of(record) == "rows.dlq/1/42"
    got = letter_of(record)
    assert got.ref == "rows.dlq/1/42"
    assert got.payload == b"payload"
    assert got.key == b"k1"
    assert got.partition == 1
    assert got.queued_at == datetime(2026, 12, 2, 8, 0, tzinfo=UTC)
    assert got.headers == (("rowbatch-table", b"docs"), ("rowbatch-dlq-reason", b"undecodable"))
    assert got.attributes == {"rowbatch-table": "docs", "rowbatch-dlq-reason": "undecodable"}
    assert got.reason == "undecodable"


def test_a_kafka_record_without_value_headers_or_time() -> None:
    got = letter_of(Record(value=None, headers=None, timestamp=-1, key=None))
    assert got.payload == b""
    assert got.headers == ()
    assert got.attributes == {}
    assert got.queued_at is None
    assert got.key is None
    assert letter_of(Record(timestamp=None)).queued_at is None
    assert letter_of(Record(headers=(("empty", None),))).headers == (("empty", b""),)


def test_marker_of_names_the_replayed_letter_only_on_a_marker() -> None:
    marker = Record(headers=((MARKER_AS, b"rows/0/7"), (MARKER, b"rows.dlq/1/3")))
    assert marker_of(marker) == "rows.dlq/1/3"
    assert marker_of(Record(headers=((MARKER_AS, b"rows/0/7"),))) is None
    assert marker_of(Record(headers=(("rowbatch-dlq-reason", b"undecodable"),))) is None
    assert marker_of(Record(headers=None)) is None


def test_replay_headers_keep_non_utf8_bytes_unchanged() -> None:
    raw = b"\xff\xfe\x00binary"
    record = Record(
        headers=(
            ("rowbatch-chunk-id", b"c1"),
            ("blob", raw),
            ("rowbatch-dlq-reason", b"undecodable"),
            ("rowbatch-dlq-code", b"invalid_json"),
            (REPLAYED_FROM, b"rows.dlq/0/1"),
            (REPLAY_COUNT, b"1"),
            ("trace", b"abc"),
        )
    )
    got = letter_of(record)
    assert got.attributes["blob"] == raw.decode("utf-8", errors="replace")  # shown replaced
    assert got.replays == 1
    assert got.replay_headers() == [
        ("rowbatch-chunk-id", b"c1"),
        ("blob", raw),  # published as it was
        ("trace", b"abc"),
        (REPLAYED_FROM, b"rows.dlq/1/42"),
        (REPLAY_COUNT, b"2"),
    ]


def test_replay_headers_drop_dead_letter_headers_in_any_case() -> None:
    got = letter_of(Record(headers=(("RowBatch-DLQ-Reason", b"x"), ("keep", b"1"))))
    assert got.replay_headers() == [
        ("keep", b"1"),
        (REPLAYED_FROM, b"rows.dlq/1/42"),
        (REPLAY_COUNT, b"1"),
    ]


def test_text_of_replaces_bytes_that_are_not_utf8() -> None:
    assert text_of((("a", b"ok"), ("b", b"\xff"))) == {"a": "ok", "b": "\ufffd"}


def test_the_replay_count_is_read_whatever_the_case_of_its_name() -> None:
    """``replay_headers`` drops the count in any case: it must be read in any case too, or a
    replay would start it at 1 again."""
    found = letter({"Rowbatch-Replay-Count": "4"})
    assert found.replays == 4
    assert found.replay_attributes()["rowbatch-replay-count"] == "5"
    assert "Rowbatch-Replay-Count" not in found.replay_attributes()
