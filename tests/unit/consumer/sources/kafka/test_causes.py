"""aiokafka's logged connect causes end up in rowbatch's error message."""

from __future__ import annotations

import logging

from rowbatch.consumer.sources.kafka.causes import connect_causes


def test_causes_for_the_configured_servers_are_collected_once_each() -> None:
    log = logging.getLogger("aiokafka.client")
    with connect_causes("127.0.0.1:9092, 127.0.0.1:9093") as causes:
        log.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9092, "[Error 58] Sasl: bad")
        log.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9092, "[Error 58] Sasl: bad")
        log.error('Unable connect to "%s:%s": %s', "127.0.0.1", 9093, "refused")
        log.error('Unable connect to "%s:%s": %s', "10.0.0.1", 9092, "another client's")
        log.error("Unable to update metadata from %s", [1])
    assert causes.causes == ["[Error 58] Sasl: bad", "refused"]
    assert causes.describe() == "; cause: [Error 58] Sasl: bad | refused"


def test_nothing_is_collected_after_the_block() -> None:
    with connect_causes("h:1") as causes:
        pass
    logging.getLogger("aiokafka").error('Unable connect to "h:1": late')
    assert causes.causes == []
    assert causes.describe() == ""
