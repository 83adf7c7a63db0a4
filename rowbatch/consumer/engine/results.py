"""Answered batches on their way to the sink: the part the inference workers hand to the
writers, merging parts into one write and splitting one per message, and building the result
rows (with the columns the consumer adds itself) from them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.row_keys import row_keys
from rowbatch.consumer.observe.costs import write_bytes
from rowbatch.consumer.sinks.base import ENCODE_SLICE_BYTES, ColumnSpec, ResultRows
from rowbatch.consumer.sources.delivery import DeadLetterReason

ERROR_COLUMNS: Final = ("error_reason", "error_code", "error_message")
"""The result columns an error row carries (``on_row_error = "error-row"``): its reason
class, code and words, null on the rows the model answered."""


@dataclass(frozen=True, eq=False)
class Answered:
    """A batch (or the part of one that survived poison isolation) with the model's outputs,
    waiting to be written."""

    batch: Batch
    outputs: Mapping[str, NDArray[Any]]
    model_version: str = ""
    """The version of the model that answered, as its response named it (``""``: not said)."""
    span: Any = None
    """The inference request's span, when tracing is on (the write's span links to it)."""
    errors: Mapping[str, NDArray[Any]] | None = None
    """An error part (``on_row_error = "error-row"``): its rows failed on their own and are
    written with null outputs and these values of :data:`ERROR_COLUMNS`; ``outputs`` is
    empty."""
    model_name: str = ""
    """The model that answered when it is not the configured one (a canary's candidate:
    ``model_version`` is then written as it is); ``""``: the configured model."""

    def take(self, index: NDArray[np.int64] | slice, batch: Batch) -> Answered:
        """Rows ``index`` of this part, whose rows ``batch`` holds."""
        outputs = {k: v[index] for k, v in self.outputs.items()}
        errors = None if self.errors is None else {k: v[index] for k, v in self.errors.items()}
        return replace(self, batch=batch, outputs=outputs, errors=errors)

    @property
    def model(self) -> tuple[str, str]:
        """Who answered (name, version): a write holds the parts of one."""
        return self.model_name, self.model_version


def error_part(rows: Batch, reason: DeadLetterReason) -> Answered:
    """``rows`` (failed on their own for ``reason``) as an error part."""
    n = len(rows)
    values = (reason.reason_class.value, reason.code, reason.message)
    errors = {
        name: np.full(n, value, dtype=object)
        for name, value in zip(ERROR_COLUMNS, values, strict=True)
    }
    return Answered(rows, {}, errors=errors)


def split_by_message(part: Answered) -> list[Answered]:
    """One part per segment (each segment is one message's rows), for bisecting a write."""
    if len(part.batch.segments) == 1:
        return [part]
    return [
        part.take(part.batch.rows_of([segment]), part.batch.select([segment]))
        for segment in part.batch.segments
    ]


def split_to_rows(part: Answered) -> list[Answered]:
    """As :func:`split_by_message`, and a part of one message's rows into its two halves, so a
    write the sink rejects is bisected down to the rows it rejects (for a source that
    dead-letters rows: ``DeadLettersRows``)."""
    if len(part.batch.segments) > 1 or len(part.batch) < 2:
        return split_by_message(part)
    batch = part.batch
    [segment] = batch.segments
    half = len(batch) // 2
    return [
        _rows(part, segment, 0, half),
        _rows(part, segment, half, len(batch)),
    ]


def _rows(part: Answered, segment: Segment, start: int, stop: int) -> Answered:
    """Rows ``[start, stop)`` of a one-segment part."""
    batch = part.batch
    nulls = {k: m[start:stop] for k, m in batch.nulls.items() if m[start:stop].any()}
    rows = Batch(
        {k: v[start:stop] for k, v in batch.columns.items()},
        nulls,
        (Segment(segment.message, segment.start + start, segment.start + stop),),
        batch.oldest_at,
    )
    return part.take(slice(start, stop), rows)


def part_bytes(part: Answered) -> int:
    """The bytes of a part's columns, null masks and outputs (what joining it copies)."""
    batch = part.batch
    errors = () if part.errors is None else part.errors.values()
    arrays = (*batch.columns.values(), *batch.nulls.values(), *part.outputs.values(), *errors)
    return sum(a.nbytes for a in arrays)


def write_cost(parts: Sequence[Answered]) -> int:
    """What one sink write of ``parts`` holds on top of what their messages are charged
    (:func:`rowbatch.consumer.observe.costs.write_bytes`: the parts are joined when there are
    several, and encoded in slices of ``ENCODE_SLICE_BYTES``)."""
    rows = sum(len(p.batch) for p in parts)
    data = sum(map(part_bytes, parts))
    return write_bytes(rows, data, joined=len(parts) > 1, encode_slice_bytes=ENCODE_SLICE_BYTES)


def largest_write_cost(
    max_write_rows: int, max_write_bytes: int, batch_rows: int, row_bytes: int
) -> int:
    """:func:`write_cost` of the largest write the write stage coalesces: up to
    ``max_write_rows`` rows of ``row_bytes`` each, taken while under ``max_write_bytes`` of
    outputs (so at most one batch past it)."""
    rows = max(max_write_rows, batch_rows)
    data = min(rows * row_bytes, max_write_bytes + batch_rows * row_bytes)
    return write_bytes(rows, data, joined=rows > batch_rows, encode_slice_bytes=ENCODE_SLICE_BYTES)


def merge(parts: Sequence[Answered]) -> tuple[Batch, Mapping[str, NDArray[Any]]]:
    """The parts as one batch and one set of outputs (rows in part order)."""
    if len(parts) == 1:
        return parts[0].batch, parts[0].outputs
    batches = [p.batch for p in parts]
    sizes = [len(b) for b in batches]
    columns = {k: np.concatenate([b.columns[k] for b in batches]) for k in batches[0].columns}
    nulls: dict[str, NDArray[np.bool_]] = {}
    for name in {k for b in batches for k in b.nulls}:
        nulls[name] = np.concatenate(
            [b.nulls.get(name, np.zeros(n, np.bool_)) for b, n in zip(batches, sizes, strict=True)]
        )
    outputs = {k: np.concatenate([p.outputs[k] for p in parts]) for k in parts[0].outputs}
    merged = Batch(
        columns=columns,
        nulls=nulls,
        segments=tuple(s for b in batches for s in b.segments),
        oldest_at=min(b.oldest_at for b in batches),
    )
    return merged, outputs


class ResultBuilder:
    """Builds one sink write's ``ResultRows`` from answered parts: the passthrough columns, the
    model outputs under their result columns, and the consumer's own columns (chunk id, row
    index, source message id, model name and version, processing time).

    ``model_version``: the version written with every row; ``""`` (a server whose metadata
    names none, e.g. MLServer): the version the parts' responses named. A write's parts share
    one answered version (the write stage does not merge parts of different versions); a
    canary's candidate parts name their model and version (``Answered.model_name``)."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        outputs: Mapping[str, str],
        passthrough: tuple[str, ...],
        model_name: str,
        model_version: str,
        wall: Callable[[], float],
        error_rows: Sequence[ColumnSpec] | None = None,
    ) -> None:
        """``error_rows``: the result columns of ``outputs`` (their dtypes and sizes) when
        rows failing on their own are written as error rows (``on_row_error =
        "error-row"``): every write then has the :data:`ERROR_COLUMNS` too."""
        self._ledger = ledger
        self._error_specs = None if error_rows is None else {c.name: c for c in error_rows}
        self._outputs = outputs
        self._passthrough = passthrough
        self._model_name = model_name
        self._model_version = model_version
        self._wall = wall

    def build(self, parts: Sequence[Answered]) -> ResultRows:
        if self._error_specs is not None:
            return self._with_errors(parts)
        return self._build(parts, merge(parts), {})

    def _with_errors(self, parts: Sequence[Answered]) -> ResultRows:
        """The rows of ``parts`` with the error columns: the error parts' outputs null."""
        failed = np.concatenate([np.full(len(p.batch), p.errors is not None) for p in parts])
        batch, outputs = merge([self._filled(p) if p.errors is not None else p for p in parts])
        extra: dict[str, tuple[NDArray[Any], NDArray[np.bool_]]] = {}
        for name in ERROR_COLUMNS:
            values = np.concatenate(
                [
                    p.errors[name] if p.errors is not None else np.full(len(p.batch), None, object)
                    for p in parts
                ]
            )
            extra[name] = (values, ~failed)
        if failed.any():
            for out, col in self._outputs.items():
                extra[col] = (outputs[out], failed)
        return self._build(parts, (batch, outputs), extra)

    def _filled(self, part: Answered) -> Answered:
        """An error part with placeholder outputs (null in the result) of the right shapes."""
        assert self._error_specs is not None
        n = len(part.batch)
        outputs: dict[str, NDArray[Any]] = {}
        for out, col in self._outputs.items():
            spec = self._error_specs[col]
            shape = (n, spec.dim) if spec.dim else (n,)
            outputs[out] = (
                np.full(shape, "", dtype=object)
                if spec.dtype == "object"
                else np.zeros(shape, dtype=spec.dtype)
            )
        return replace(part, outputs=outputs, errors=None)

    def _build(
        self,
        parts: Sequence[Answered],
        merged: tuple[Batch, Mapping[str, NDArray[Any]]],
        extra: Mapping[str, tuple[NDArray[Any], NDArray[np.bool_]]],
    ) -> ResultRows:
        """``extra``: result columns (values, null mask) beside and over the outputs."""
        batch, outputs = merged
        keys = row_keys(self._ledger, batch.segments)
        return ResultRows(
            chunk_id=keys.per_row(keys.chunk_ids),
            row_index=keys.row_index,
            source_message_id=keys.per_row(keys.message_ids),
            passthrough={k: batch.columns[k] for k in self._passthrough},
            outputs={col: outputs[out] for out, col in self._outputs.items()}
            | {name: values for name, (values, _) in extra.items()},
            nulls={k: m for k, m in batch.nulls.items() if k in self._passthrough}
            | {name: mask for name, (_, mask) in extra.items()},
            model_name=parts[0].model_name or self._model_name,
            model_version=parts[0].model_version
            if parts[0].model_name
            else self._model_version or parts[0].model_version,
            processed_at=datetime.fromtimestamp(self._wall(), UTC),
        )
