"""The model as the engine sees it: a :class:`ModelHandler` (in the spirit of Beam's
``ModelHandler``) checks each message's chunk once at intake, runs one batch and answers its
outputs with the version that answered, and sorts a failure into poison (the rows are bad:
dead-letter them) or fatal (the server failed them: nack, redeliver). The engine calls it
directly and drives isolation (bisection) itself; ``rowbatch.consumer.service`` only builds one.

:class:`OipHandler` is the one for servers speaking the Open Inference Protocol (KServe v2)
over gRPC: Triton, MLServer, KServe."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.chunk_check import check_chunk, check_passthrough, memoized_check
from rowbatch.consumer.model.discovery import output_bytes_per_row
from rowbatch.consumer.model.inference.errors import FatalInferenceError, PoisonInferenceError
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.tensors import build_inputs
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.columns.column_type import ColumnType


class BatchRows(Protocol):
    """The rows of one batch as the model needs them (the engine's ``Batch``)."""

    @property
    def columns(self) -> Mapping[str, NDArray[Any]]: ...

    @property
    def nulls(self) -> Mapping[str, NDArray[np.bool_]]: ...

    def __len__(self) -> int: ...


class AnswersRequests(Protocol):
    """Runs one request, retrying what is transient (a
    :class:`rowbatch.consumer.model.inference.retry.RetryingInferencer`)."""

    async def infer(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer: ...


class ModelHandler(Protocol):
    """What the engine calls: :meth:`check` once per message, :meth:`run` once per batch (or
    per part of a batch being isolated), :meth:`is_poison` / :meth:`is_fatal` on its errors."""

    @property
    def target_batch_size(self) -> int:
        """Rows per request the server prefers."""
        ...

    @property
    def output_bytes_per_row(self) -> int:
        """Bytes an answered row's outputs take (for the byte budget)."""
        ...

    def check(self, chunk: DecodedChunk) -> None:
        """Raises :class:`SchemaMismatch` (naming the column) when the chunk cannot feed the
        model; the engine dead-letters the message with its code."""

    async def run(self, batch: BatchRows) -> Answer:
        """The batch's outputs, one value per row for single-element outputs and ``rows x n``
        for vectors, with the version that answered. Transient failures are retried inside;
        what it raises is poison, fatal, or a bug."""
        ...

    def is_poison(self, exc: BaseException) -> bool:
        """The rows are bad (the server said so): isolate them and dead-letter them."""
        ...

    def is_fatal(self, exc: BaseException) -> bool:
        """The server failed the request for good (it may be its fault): isolate, then nack."""
        ...


class OipHandler:
    """A model on Open Inference Protocol gRPC servers, through ``inferencer`` (the retrying
    client over the balanced endpoints)."""

    def __init__(
        self,
        inferencer: AnswersRequests,
        spec: ModelSpec,
        binding: Binding,
        passthrough: Mapping[str, ColumnType],
        target_batch_size: int,
    ) -> None:
        self._inferencer = inferencer
        self._spec = spec
        self._binding = binding
        self._passthrough = dict(passthrough)
        self._outputs = list(binding.outputs)
        self._target = target_batch_size
        self._bytes_per_row = output_bytes_per_row(spec)
        self.check = memoized_check(spec, binding, self._check, tuple(self._passthrough))

    @property
    def target_batch_size(self) -> int:
        return self._target

    @property
    def output_bytes_per_row(self) -> int:
        return self._bytes_per_row

    def _check(self, chunk: DecodedChunk) -> None:
        """Bound columns fit the model, passthrough columns have their type (the type checks
        run once per column signature: ``memoized_check``)."""
        missing = [c for c in self._binding.columns if c not in chunk.columns]
        if missing:
            raise SchemaMismatch(
                f"chunk of table {chunk.table!r} lacks column(s) {missing}; "
                f"it has {sorted(chunk.columns)}",
                column=missing[0],
                expected="present",
                found="absent",
                code="missing_column",
            )
        check_passthrough(chunk, self._passthrough)
        check_chunk(
            self._spec, self._binding, {name: chunk.column(name) for name in self._binding.columns}
        )

    async def run(self, batch: BatchRows) -> Answer:
        inputs = build_inputs(self._spec, self._binding, batch.columns, batch.nulls)
        answer = await self._inferencer.infer(inputs, self._outputs)
        rows = len(batch)
        return Answer(
            {
                name: a.reshape(rows) if a.size == rows else a.reshape(rows, -1)
                for name, a in answer.outputs.items()
            },
            answer.model_version,
        )

    def is_poison(self, exc: BaseException) -> bool:
        return isinstance(exc, PoisonInferenceError)

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, FatalInferenceError)
