"""What holding something costs in memory, in bytes: the one cost model of the consumer, for
the byte budget (``rowbatch.consumer.engine.budget.ByteBudget``) and the read-ahead the sources
hold in it. Each figure is a rule over sizes the caller knows (payload and attribute lengths,
array data, row counts) plus a measured overhead for the objects that keep it, named here once:

- a message taken into the pipeline, until it is settled (:func:`held_cost`,
  :func:`message_cost`);
- a Pub/Sub message pulled and not yet yielded (:func:`pulled_cost`);
- a Kafka record fetched and not yet yielded (:func:`fetched_record_cost`);
- one sink write, on top of its messages' charges (:func:`write_bytes`).

Below the sources and the engine, so both can use it (it imports neither)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

MESSAGE_OVERHEAD_BYTES = 1600
"""Measured (tests/unit/consumer/engine/test_memory_accounting.py), charged once per held
message on top of its byte sizes: the ``Delivery`` and its strings, the source's record of it
(Kafka: the ``ConsumerRecord``, its ``_Held``, the unsettled-map and offset-tracker slots), the
ledger ``Entry`` and the batcher's pending entry, and the ``MessageRows`` with its dicts."""
ATTRIBUTE_OVERHEAD_BYTES = 250
"""Per attribute/header, on top of twice its name and value lengths: it is held as bytes
(the broker's record) and as ``str`` (``Delivery.attributes``), each an object and a slot."""
ARRAY_OVERHEAD_BYTES = 170
"""Per numpy array object a message's decoded columns hold (header, shape, strides and the
allocation of its data), counting every array in a view's ``base`` chain."""
FOREIGN_BUFFER_OVERHEAD_BYTES = 900
"""Per column whose array is a zero-copy view of memory numpy does not own (Arrow): the
pyarrow array and buffer objects it keeps alive. Not charged for a view of the payload's own
``bytes`` (Arrow columns read in place, ``rowbatch.wire.codec_arrow``): that keeps only the
payload alive, which is counted already."""

PULLED_OVERHEAD_BYTES = 700
"""Measured (``python -m tests.unit.consumer.engine.test_memory_accounting_pubsub``: 2.2-3.4 KB
a 1-row message waiting, charged 3.1-3.5 KB), on top of the payload and attributes: what
holding one received, not yet yielded Pub/Sub message costs (the ``Delivery`` and its strings,
the ack id, the pull source's and the lease keeper's records of it)."""

RECORD_OVERHEAD_BYTES = 800
"""Measured (tests/unit/consumer/engine/test_memory_accounting.py): a held Kafka record's
objects besides its key, value and header bytes (the ``ConsumerRecord``, its headers list, the
``Held``, the buffer and offset-tracker slots)."""
HEADER_OVERHEAD_BYTES = 170
"""Per Kafka header: its tuple and the ``str``/``bytes`` objects of its name and value."""

WRITE_ROW_OVERHEAD_BYTES = 256
"""Per row of a sink write, what building and encoding it holds besides the row's values: the
key and id arrays (chunk and message ids as object arrays, row indexes) and the sinks' own
per-row objects (SQLite's row tuples, PostgreSQL's COPY fields of a slice)."""


class HeldMessage(Protocol):
    """What :func:`pulled_cost` reads of a message (a ``Delivery``)."""

    @property
    def size(self) -> int:
        """Bytes the broker counts (payload plus attributes)."""
        ...

    @property
    def attributes(self) -> Mapping[str, str]: ...


def attributes_bytes(attributes: Mapping[str, str]) -> int:
    """The lengths of the attributes' names and values, summed."""
    return sum(map(len, attributes)) + sum(map(len, attributes.values()))


def _array_overhead(values: NDArray[Any]) -> int:
    cost = 0
    base: Any = values
    while isinstance(base, np.ndarray):
        cost += ARRAY_OVERHEAD_BYTES
        base = base.base
    # A view of a bytes object (a payload read in place) keeps nothing but the payload alive.
    return cost if base is None or type(base) is bytes else cost + FOREIGN_BUFFER_OVERHEAD_BYTES


def arrays_overhead(arrays: Iterable[NDArray[Any]]) -> int:
    """What ``arrays`` cost beyond their data (see ``ARRAY_OVERHEAD_BYTES``)."""
    return sum(map(_array_overhead, arrays))


def held_cost(
    payload_bytes: int,
    *,
    attribute_bytes: int,
    attribute_count: int,
    array_overhead: int,
    decoded_bytes: int,
    output_bytes: int,
) -> int:
    """What holding one message in the pipeline costs until it is settled: ``payload_bytes``
    (the raw payload, held until the ack), its attributes (``attribute_bytes`` of names and
    values, ``attribute_count`` of them), its decoded columns (``decoded_bytes`` of data, and
    ``array_overhead`` for their array objects), the ``output_bytes`` the model will return for
    its rows, and ``MESSAGE_OVERHEAD_BYTES``. From sizes the caller measured already (the
    decoder measures the attributes for its size check, and knows the arrays' overhead of an
    Arrow layout seen before); :func:`message_cost` measures them itself."""
    return (
        MESSAGE_OVERHEAD_BYTES
        + payload_bytes
        + 2 * attribute_bytes
        + ATTRIBUTE_OVERHEAD_BYTES * attribute_count
        + array_overhead
        + decoded_bytes
        + output_bytes
    )


def message_cost(
    payload_bytes: int,
    attributes: Mapping[str, str],
    arrays: Iterable[NDArray[Any]],
    decoded_bytes: int,
    output_bytes: int,
) -> int:
    """:func:`held_cost` of a message with these ``attributes`` and these numpy ``arrays`` (its
    decoded columns and null masks, whose data is ``decoded_bytes``)."""
    return held_cost(
        payload_bytes,
        attribute_bytes=attributes_bytes(attributes),
        attribute_count=len(attributes),
        array_overhead=arrays_overhead(arrays),
        decoded_bytes=decoded_bytes,
        output_bytes=output_bytes,
    )


def pulled_cost(message: HeldMessage) -> int:
    """What holding a pulled Pub/Sub ``message`` costs while it waits to be yielded: its size,
    its attributes as :func:`held_cost` counts them, and ``PULLED_OVERHEAD_BYTES``."""
    attributes = message.attributes
    cost = PULLED_OVERHEAD_BYTES + message.size
    if attributes:
        cost += ATTRIBUTE_OVERHEAD_BYTES * len(attributes)
        cost += 2 * attributes_bytes(attributes)
    return cost


def fetched_record_cost(size: int, header_count: int) -> int:
    """What holding a fetched Kafka record costs while it is read ahead: its ``size`` (key,
    value and header bytes), ``RECORD_OVERHEAD_BYTES`` and ``HEADER_OVERHEAD_BYTES`` for each
    of its ``header_count`` headers."""
    return size + RECORD_OVERHEAD_BYTES + HEADER_OVERHEAD_BYTES * header_count


def write_bytes(rows: int, data_bytes: int, *, joined: bool, encode_slice_bytes: int) -> int:
    """What one sink write of ``rows`` rows holds on top of what their messages are charged:
    the joined batch when several parts are joined (``joined``: a copy of their
    ``data_bytes`` of columns and outputs), ``WRITE_ROW_OVERHEAD_BYTES`` a row, and the sink's
    encode buffers (two slices of ``encode_slice_bytes``, the one being encoded and the one
    being sent; at most twice the write's values, for small writes)."""
    copy = data_bytes if joined else 0
    return copy + rows * WRITE_ROW_OVERHEAD_BYTES + min(2 * encode_slice_bytes, 2 * data_bytes)
