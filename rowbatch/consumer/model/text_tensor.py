"""BYTES tensors without Python bytecode per row: a text column is checked per message (one
``join`` and ``encode``) and serialised per batch (``map``/``zip``/``join``) into the raw form
KServe v2 / Triton take: each element as a little-endian uint32 length, then its bytes; what
``tritonclient.utils.serialize_byte_tensor`` makes with a numpy iterator and ``struct.pack``
per element.

Values that are not all ``str`` (or all bytes-like), or text that is not UTF-8 encodable, take
the per-row path, which names the offending row."""

from __future__ import annotations

import struct
from itertools import chain
from typing import Any, Final

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray

from rowbatch.consumer.model.mismatch import SchemaMismatch

_BYTES_LIKE: Final = frozenset({bytes, bytearray, memoryview, np.bytes_})


def utf8_elements(column: str, values: NDArray[Any]) -> list[bytes]:
    """Each element as bytes (``str`` encoded as UTF-8), row by row; a ``None`` is a null.
    Raises :class:`SchemaMismatch` naming the first row that is not text."""
    try:
        return [v.encode("utf-8") for v in values.ravel()]  # the common case: all str
    except (AttributeError, UnicodeEncodeError):
        pass
    out: list[bytes] = []
    for row, v in enumerate(values.ravel()):
        if isinstance(v, str):
            try:
                out.append(v.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise SchemaMismatch(
                    f"column {column!r}: row {row} is not encodable as UTF-8 ({exc.reason})",
                    column=column,
                    expected="UTF-8 encodable text",
                    found=repr(v[exc.start : exc.end]),
                    row=row,
                    code="invalid_value",
                ) from exc
        elif isinstance(v, bytes | bytearray | memoryview | np.bytes_):
            out.append(bytes(v))
        else:
            null = "null" if v is None else type(v).__name__
            raise SchemaMismatch(
                f"column {column!r}: row {row} is {null}, not text",
                column=column,
                expected="text or bytes",
                found=null,
                row=row,
                code="null_not_allowed" if v is None else "column_type_mismatch",
            )
    return out


class _Prefixes(dict[int, bytes]):
    """Length prefixes, made once per length (short lengths are kept)."""

    def __missing__(self, length: int) -> bytes:
        prefix = _LENGTH.pack(length)
        if length < _KEPT:
            self[length] = prefix
        return prefix


_LENGTH: Final = struct.Struct("<I")
_KEPT: Final = 1 << 16
_PREFIXES: Final = _Prefixes()


def check_text(column: str, values: NDArray[Any]) -> None:
    """Raises :class:`SchemaMismatch` where :func:`utf8_elements` would."""
    items = values.ravel().tolist()
    kinds = set(map(type, items))
    if kinds <= {str}:
        try:
            "".join(items).encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return
    elif values.dtype == object and kinds <= _BYTES_LIKE:
        return
    utf8_elements(column, values)


def serialize_text(column: str, values: NDArray[Any]) -> bytes:
    """The elements of ``values`` (row-major) in Triton's raw BYTES form; raises
    :class:`SchemaMismatch` where :func:`utf8_elements` would."""
    try:
        elements = list(map(str.encode, values.ravel().tolist()))
    except (TypeError, UnicodeEncodeError):  # not all str: bytes, or a bad row to report
        elements = utf8_elements(column, values)
    prefixes = map(_PREFIXES.__getitem__, map(len, elements))
    return b"".join(chain.from_iterable(zip(prefixes, elements, strict=True)))


def bytes_input(name: str, shape: list[int], raw: bytes) -> Any:
    """A BYTES ``InferInput`` holding ``raw`` (from :func:`serialize_text`): what
    ``set_data_from_numpy`` stores for an object array, without its per-element loop."""
    infer_input = grpcclient.InferInput(name, shape, "BYTES")
    infer_input._raw_content = raw  # tritonclient.grpc keeps the serialised tensor here
    return infer_input
