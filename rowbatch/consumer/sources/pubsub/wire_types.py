"""The Pub/Sub protobuf messages the pull source sends and reads, built at import from the
table below into a private descriptor pool.

Why not google-cloud-pubsub's types: its generated proto-plus classes (every message of the
API, with their wrappers) and ``google.api_core.retry`` cost a consumer ~22 MiB of RSS at
start-up (docs/memory.md); these few messages cost well under one. They are a subset of
``google/pubsub/v1/pubsub.proto`` with its field names and numbers, so they are the same on
the wire; fields left out of a response are kept as unknown fields and ignored.
``tests/unit/consumer/sources/pubsub/test_wire_types.py`` checks each against the library's
own types both ways."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "rowbatch.pubsub_wire"

_SPEC = """
Stamp: int64 seconds 1; int32 nanos 2
PubsubMessage: bytes data 1; map attributes 2; string message_id 3; Stamp publish_time 4;
    string ordering_key 5
ReceivedMessage: string ack_id 1; PubsubMessage message 2; int32 delivery_attempt 3
PullRequest: string subscription 1; int32 max_messages 3
PullResponse: repeated ReceivedMessage received_messages 1
AcknowledgeRequest: string subscription 1; repeated string ack_ids 2
ModifyAckDeadlineRequest: string subscription 1; int32 ack_deadline_seconds 3;
    repeated string ack_ids 4
PublishRequest: string topic 1; repeated PubsubMessage messages 2
PublishResponse: repeated string message_ids 1
GetSubscriptionRequest: string subscription 1
DeadLetterPolicy: string dead_letter_topic 1; int32 max_delivery_attempts 2
Subscription: string name 1; string topic 2; int32 ack_deadline_seconds 5;
    bool enable_message_ordering 10; DeadLetterPolicy dead_letter_policy 13
GetTopicRequest: string topic 1
Topic: string name 1
Empty:
"""
"""``Message: [repeated] type name number; ...``: ``map`` is ``map<string, string>``;
``Stamp`` is ``google.protobuf.Timestamp`` (same fields); a line may continue indented."""

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "bool": _F.TYPE_BOOL,
}


def _messages(spec: str) -> dict[str, list[list[str]]]:
    joined = spec.replace("\n    ", " ")
    out: dict[str, list[list[str]]] = {}
    for line in filter(None, (raw.strip() for raw in joined.splitlines())):
        name, _, fields = line.partition(":")
        out[name] = [part.split() for part in fields.split(";") if part.strip()]
    return out


def _field(message: descriptor_pb2.DescriptorProto, words: list[str]) -> None:
    repeated = words[0] == "repeated"
    kind, name, number = words[1:] if repeated else words
    field = message.field.add(name=name, number=int(number), json_name=name)
    field.label = _F.LABEL_REPEATED if repeated or kind == "map" else _F.LABEL_OPTIONAL
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
        return
    field.type = _F.TYPE_MESSAGE
    if kind != "map":
        field.type_name = f".{PACKAGE}.{kind}"
        return
    entry = message.nested_type.add(name="".join(p.title() for p in name.split("_")) + "Entry")
    entry.options.map_entry = True
    for number_, side in enumerate(("key", "value"), start=1):
        entry.field.add(name=side, number=number_, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    field.type_name = f".{PACKAGE}.{message.name}.{entry.name}"


def _build(spec: str) -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(
        name="rowbatch/pubsub_wire.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _messages(spec).items():
        message = file.message_type.add(name=name)
        for words in fields:
            _field(message, words)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _messages(spec)
    }


_CLASSES = _build(_SPEC)

PubsubMessage: Any = _CLASSES["PubsubMessage"]
ReceivedMessage: Any = _CLASSES["ReceivedMessage"]
PullRequest: Any = _CLASSES["PullRequest"]
PullResponse: Any = _CLASSES["PullResponse"]
AcknowledgeRequest: Any = _CLASSES["AcknowledgeRequest"]
ModifyAckDeadlineRequest: Any = _CLASSES["ModifyAckDeadlineRequest"]
PublishRequest: Any = _CLASSES["PublishRequest"]
PublishResponse: Any = _CLASSES["PublishResponse"]
GetSubscriptionRequest: Any = _CLASSES["GetSubscriptionRequest"]
Subscription: Any = _CLASSES["Subscription"]
GetTopicRequest: Any = _CLASSES["GetTopicRequest"]
Topic: Any = _CLASSES["Topic"]
Empty: Any = _CLASSES["Empty"]
