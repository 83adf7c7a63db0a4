"""The bench runner drops its Pub/Sub topics after each section (the emulator keeps every
topic's messages in its heap until the topic goes), on the real emulator."""

from __future__ import annotations

import dataclasses

from bench.stack import drop_pubsub_feeds
from harness.pubsub import PubSubEndpoint


def test_drop_pubsub_feeds_deletes_topics_and_subscriptions(pubsub: PubSubEndpoint) -> None:
    # A project of its own: the session's emulator is shared with other tests.
    endpoint = dataclasses.replace(pubsub, project="bench-drop-test")
    project = f"projects/{endpoint.project}"
    publisher, subscriber = endpoint.publisher(), endpoint.subscriber()
    try:
        for i in range(2):
            topic = publisher.create_topic(name=f"{project}/topics/feed-{i}").name
            subscriber.create_subscription(
                request={"name": f"{project}/subscriptions/feed-{i}-sub", "topic": topic}
            )
        other = publisher.create_topic(name=f"projects/{pubsub.project}/topics/kept").name

        assert drop_pubsub_feeds(endpoint) == 4

        assert list(publisher.list_topics(request={"project": project})) == []
        assert list(subscriber.list_subscriptions(request={"project": project})) == []
        kept = [
            t.name for t in publisher.list_topics(request={"project": f"projects/{pubsub.project}"})
        ]
        assert other in kept
        publisher.delete_topic(request={"topic": other})
    finally:
        publisher.transport.close()
        subscriber.close()
