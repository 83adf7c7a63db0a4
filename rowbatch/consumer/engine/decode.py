"""From a delivery to rows ready for the batcher, or to a dead-letter reason.

Decoding and schema checks happen here, once per message, so a poison message never reaches a
batch (and never costs an inference call)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.bad_rows import ROW_CODES, find_bad_rows, named_row, rows_of
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.observe.costs import arrays_overhead, attributes_bytes, held_cost
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.json_rows import ROW_ERRORS, bad_json_rows, json_rows, with_rows
from rowbatch.wire.chunks.row_parts import parent_of
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import H_PARENT_CHUNK_ID

log = logging.getLogger(__name__)


class PoisonMessage(Exception):
    """This message can never be processed; it goes to the dead-letter topic."""

    def __init__(self, reason: DeadLetterReason) -> None:
        super().__init__(reason.message)
        self.reason = reason


class PoisonRows(PoisonMessage):
    """Some rows of this message fail the binding's value checks on their own: ``failed``
    (their indexes in the message, ascending, with why); ``kept`` holds the message's other rows
    (its ``positions`` their indexes in the message, its ``row_keys`` their keys), ``bad`` the
    failed rows in the same form (for error rows). Where rows cannot go on their own, the whole
    message is dead-lettered with ``reason`` (its first failure, as for any poison message)."""

    def __init__(
        self,
        reason: DeadLetterReason,
        kept: MessageRows,
        failed: tuple[tuple[int, DeadLetterReason], ...],
        bad: MessageRows | None,
        rows: int,
    ) -> None:
        super().__init__(reason)
        self.kept = kept
        self.failed = failed
        self.bad = bad
        """None when some failed rows did not decode (nothing to write of them)."""
        self.rows = rows
        """The message's rows, kept and failed."""


@dataclass(frozen=True, eq=False)
class MessageRows:
    """The columns of one message that the consumer needs (model inputs and passthrough)."""

    chunk_id: str
    rows: int
    columns: Mapping[str, NDArray[Any]]
    nulls: Mapping[str, NDArray[np.bool_]]
    nbytes: int
    """Memory the decoded columns hold (text counted by its UTF-8 length plus overhead)."""
    attribute_bytes: int = 0
    """The delivery's attributes' names and values, their lengths summed (for its cost)."""
    array_overhead: int = 0
    """What the arrays of ``columns`` and ``nulls`` cost beyond their data (see
    ``rowbatch.consumer.observe.costs.arrays_overhead``)."""
    row_keys: NDArray[np.int64] | None = None
    """A row part's rows' indexes in its parent chunk (``chunk_id`` is then the parent's), the
    keys its rows are written under; None for a whole chunk (row ``i`` keyed ``i``)."""
    positions: NDArray[np.int64] | None = None
    """The rows' indexes in their message when some of its rows were left out (failing the
    value checks on their own: ``PoisonRows``); None: row ``i`` is the message's row ``i``."""

    @classmethod
    def _of(
        cls,
        chunk_id: str,
        rows: int,
        columns: Mapping[str, NDArray[Any]],
        nulls: Mapping[str, NDArray[np.bool_]],
        nbytes: int,
        *,
        attribute_bytes: int,
        array_overhead: int,
    ) -> MessageRows:
        """The instance, without the frozen dataclass's per-field ``__init__`` (a cost per
        message)."""
        out = object.__new__(cls)
        out.__dict__.update(
            chunk_id=chunk_id,
            rows=rows,
            columns=columns,
            nulls=nulls,
            nbytes=nbytes,
            attribute_bytes=attribute_bytes,
            array_overhead=array_overhead,
        )
        return out


def _parent(attributes: Mapping[str, str], rows: int) -> tuple[str, NDArray[np.int64]] | None:
    """A row part's parent chunk id and its ``rows`` rows' indexes there; None for a whole
    chunk; ``PoisonMessage`` when the headers naming them are malformed."""
    try:
        return parent_of(attributes, rows)
    except WireError as exc:
        raise PoisonMessage(
            DeadLetterReason(ReasonClass.UNDECODABLE, f"{exc.reason}: {exc}", exc.reason)
        ) from exc


def _as_part(rows: MessageRows, attributes: Mapping[str, str]) -> MessageRows:
    """``rows`` of a row part (``rowbatch.wire.chunks.row_parts``): keyed by its parent's chunk
    id and the parent's row indexes."""
    found = _parent(attributes, rows.rows)
    return rows if found is None else _keyed(rows, *found)


def _keyed(rows: MessageRows, chunk_id: str, keys: NDArray[np.int64]) -> MessageRows:
    """``rows`` written under (``chunk_id``, ``keys``)."""
    out = MessageRows._of(
        chunk_id,
        rows.rows,
        rows.columns,
        rows.nulls,
        rows.nbytes,
        attribute_bytes=rows.attribute_bytes,
        array_overhead=rows.array_overhead,
    )
    out.__dict__["row_keys"] = keys
    return out


def _mismatch(exc: SchemaMismatch) -> DeadLetterReason:
    return DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, f"{exc.code}: {exc}", exc.code)


def rows_cost(delivery: Delivery, rows: MessageRows, output_bytes: int) -> int:
    """What holding ``delivery``, decoded as ``rows``, costs
    (:func:`rowbatch.consumer.observe.costs.held_cost`) from the sizes the decoder measured, with
    ``output_bytes`` of answers to come."""
    return held_cost(
        len(delivery.payload),
        attribute_bytes=rows.attribute_bytes,
        attribute_count=len(delivery.attributes),
        array_overhead=rows.array_overhead,
        decoded_bytes=rows.nbytes,
        output_bytes=output_bytes,
    )


SchemaCheck = Callable[[DecodedChunk], None]
"""Raises an exception with a message naming the column when a chunk cannot feed the model."""


def _nbytes(values: NDArray[Any]) -> int:
    if values.dtype.kind == "O":
        # A Python str costs ~49 bytes plus its length; count that, not the 8-byte pointer.
        items = values.ravel().tolist()
        try:
            text = sum(map(len, items)) + 49 * len(items)  # no nulls: one pass in C
        except TypeError:
            text = sum(len(v) + 49 if v is not None else 16 for v in items)
        return int(text) + values.nbytes
    return int(values.nbytes)


@dataclass(frozen=True)
class DecodeLimits:
    """Sizes past which a message is dead-lettered before it is decoded (the configuration's
    ``max_message_bytes`` and ``max_attributes_bytes``, which declare the defaults)."""

    max_message_bytes: int
    max_attributes_bytes: int


class MessageDecoder:
    def __init__(
        self,
        needed_columns: tuple[str, ...],
        check: SchemaCheck,
        max_delivery_attempts: int | None = None,
        limits: DecodeLimits | None = None,
    ) -> None:
        self._needed = needed_columns
        self._check = check
        self._max_attempts = max_delivery_attempts
        self._limits = limits
        """None: no size limits (the service passes the configured ones)."""
        # The sizes of the needed columns of the last Arrow layout read in place (chunks of
        # one layout share their types mapping, held here so its id cannot be reused): the
        # same dtypes, shapes and view chains, so the same bytes and array overhead.
        self._layout_sizes: tuple[Mapping[str, Any], int, int] | None = None

    def rows(self, delivery: Delivery) -> MessageRows:
        """Decode and check one delivery; raises ``PoisonMessage`` with the reason."""
        if self._max_attempts is not None and delivery.delivery_attempt > self._max_attempts:
            raise PoisonMessage(
                DeadLetterReason(
                    ReasonClass.TOO_MANY_ATTEMPTS,
                    f"delivered {delivery.delivery_attempt} times "
                    f"(max_delivery_attempts={self._max_attempts}) without being written",
                )
            )
        attribute_bytes = self._check_sizes(delivery)
        try:
            chunk = decode_chunk(delivery.payload, delivery.attributes)
        except WireError as exc:
            reason = DeadLetterReason(ReasonClass.UNDECODABLE, f"{exc.reason}: {exc}", exc.reason)
            if isinstance(exc, ROW_ERRORS):  # maybe some rows of a JSON payload only
                split = self._json_rows_apart_or_none(delivery, attribute_bytes, reason)
                if split is not None:
                    raise split from exc
            raise PoisonMessage(reason) from exc
        except Exception as exc:
            # A decoder bug must not stop the consumer on one message (it would crash-loop on
            # its redelivery): the message is dead-lettered with what went wrong.
            log.exception("decoding message %s failed unexpectedly", delivery.message_id)
            raise PoisonMessage(
                DeadLetterReason(
                    ReasonClass.UNDECODABLE,
                    f"wire_error: the decoder failed on this message ({type(exc).__name__}: {exc})",
                    "wire_error",
                )
            ) from exc
        try:
            self._check(chunk)
        except SchemaMismatch as exc:
            reason = _mismatch(exc)
            if exc.code in ROW_CODES and chunk.row_count > 1:
                split = self._rows_apart(chunk, attribute_bytes, delivery.attributes, reason)
                if split is not None:
                    raise split from exc
            raise PoisonMessage(reason) from exc
        except (ValueError, TypeError, KeyError) as exc:
            raise PoisonMessage(
                DeadLetterReason(
                    ReasonClass.SCHEMA_MISMATCH,
                    f"column_type_mismatch: {type(exc).__name__}: {exc}",
                    "column_type_mismatch",
                )
            ) from exc
        if H_PARENT_CHUNK_ID in delivery.attributes:
            return _as_part(self._decoded(chunk, attribute_bytes), delivery.attributes)
        return self._decoded(chunk, attribute_bytes)

    def _rows_apart(
        self,
        chunk: DecodedChunk,
        attribute_bytes: int,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
        *,
        positions: NDArray[np.int64] | None = None,
        undecodable: Sequence[tuple[int, DeadLetterReason]] = (),
    ) -> PoisonRows | None:
        """The message's rows failing the check alone (``bad_rows.find_bad_rows``) or, in
        ``undecodable``, its decode, apart from the others; None when its failure is not its
        rows'. ``chunk`` holds the rows that decode (``positions``: their indexes in the
        message, when some did not)."""
        found: list[tuple[int, SchemaMismatch]] | None = []
        try:
            self._check(chunk)
        except SchemaMismatch as exc:
            found = find_bad_rows(self._check, chunk, positions) if exc.code in ROW_CODES else None
        except (ValueError, TypeError, KeyError):
            found = None
        if found is None:
            return None
        failing = {row for row, _ in found}
        kept = np.asarray(
            [row for row in range(chunk.row_count) if row not in failing], dtype=np.int64
        )
        if not len(kept):
            return None
        bad = np.asarray(sorted(failing), dtype=np.int64)
        total = chunk.row_count + len(undecodable)
        at = np.arange(total, dtype=np.int64) if positions is None else positions
        parent = _parent(attributes, total)

        def taken(index: NDArray[np.int64]) -> MessageRows:
            rows = self._decoded(rows_of(chunk, index), attribute_bytes)
            chunk_id, keys = rows.chunk_id, at[index]
            if parent is not None:  # a row part: keyed by its parent's rows
                chunk_id, keys = parent[0], parent[1][at[index]]
            rows = _keyed(rows, chunk_id, keys)
            rows.__dict__["positions"] = at[index]
            return rows

        checked = [(int(at[row]), _mismatch(error)) for row, error in found]
        failed = sorted([*checked, *undecodable], key=lambda f: f[0])
        # Rows that did not decode have no columns to write as error rows: none then.
        return PoisonRows(
            reason, taken(kept), tuple(failed), None if undecodable else taken(bad), total
        )

    def _json_rows_apart_or_none(
        self, delivery: Delivery, attribute_bytes: int, reason: DeadLetterReason
    ) -> PoisonRows | None:
        """:meth:`_json_rows_apart`, or None (the whole message poison) when taking the rows
        apart fails in any way: it runs inside ``rows()``'s handler of the first decode's
        error, where an exception would leave as a plain one and end intake."""
        try:
            return self._json_rows_apart(delivery, attribute_bytes, reason)
        except Exception:
            log.exception(
                "setting apart the rows of message %s that do not decode failed; "
                "the whole message is dead-lettered",
                delivery.message_id,
            )
            return None

    def _json_rows_apart(
        self, delivery: Delivery, attribute_bytes: int, reason: DeadLetterReason
    ) -> PoisonRows | None:
        """A JSON message whose decode failed in some rows only (a vector row of the wrong
        length, a null element): those rows apart (``json_rows.bad_json_rows``), the others
        decoded and checked as :meth:`_rows_apart` does; None when that cannot be."""
        payload, attributes = delivery.payload, delivery.attributes
        found = bad_json_rows(payload, attributes, decode_chunk)
        if found is None:
            return None
        failing = {row for row, _ in found}
        n = ChunkHeaders.from_attributes(attributes).row_count
        kept = np.asarray([row for row in range(n) if row not in failing], dtype=np.int64)
        chunk = decode_chunk(json_rows(payload, kept.tolist()), with_rows(attributes, len(kept)))
        undecodable = [
            (
                row,
                DeadLetterReason(
                    ReasonClass.UNDECODABLE,
                    named_row(f"{error.reason}: {error}", row),
                    error.reason,
                ),
            )
            for row, error in found
        ]
        return self._rows_apart(
            chunk, attribute_bytes, attributes, reason, positions=kept, undecodable=undecodable
        )

    def _decoded(self, chunk: DecodedChunk, attribute_bytes: int) -> MessageRows:
        decoded = chunk.columns
        columns = {name: decoded[name] for name in self._needed}
        if chunk.shared_types:  # read in place by a known layout: no nulls, sizes known
            sizes = self._layout_sizes
            if sizes is None or sizes[0] is not chunk.types:
                sizes = (
                    chunk.types,
                    sum(map(_nbytes, columns.values())),
                    arrays_overhead(columns.values()),
                )
                self._layout_sizes = sizes
            return MessageRows._of(
                chunk.headers.chunk_id,
                chunk.row_count,
                columns,
                chunk.null_masks,  # the layout's chunks have none: an empty mapping they share
                sizes[1],
                attribute_bytes=attribute_bytes,
                array_overhead=sizes[2],
            )
        masks = chunk.null_masks
        nulls = {name: masks[name] for name in self._needed if name in masks} if masks else {}
        return MessageRows._of(
            chunk.headers.chunk_id,
            chunk.row_count,
            columns,
            nulls,
            sum(map(_nbytes, columns.values())),
            attribute_bytes=attribute_bytes,
            array_overhead=arrays_overhead(itertools.chain(columns.values(), nulls.values())),
        )

    def _check_sizes(self, delivery: Delivery) -> int:
        """Raises ``PoisonMessage`` for a payload or attributes over the limits; the
        attributes' bytes (names and values)."""
        limits = self._limits
        size = len(delivery.payload)
        if limits is not None and size > limits.max_message_bytes:
            raise PoisonMessage(
                DeadLetterReason(
                    ReasonClass.UNDECODABLE,
                    f"payload_too_large: payload of {size} bytes exceeds max_message_bytes "
                    f"({limits.max_message_bytes})",
                    "payload_too_large",
                )
            )
        attributes = delivery.attributes
        headers = attributes_bytes(attributes)
        if limits is not None and headers > limits.max_attributes_bytes:
            raise PoisonMessage(
                DeadLetterReason(
                    ReasonClass.UNDECODABLE,
                    f"headers_too_large: {len(delivery.attributes)} attributes/headers take "
                    f"{headers} bytes, more than max_attributes_bytes "
                    f"({limits.max_attributes_bytes})",
                    "headers_too_large",
                )
            )
        return headers
