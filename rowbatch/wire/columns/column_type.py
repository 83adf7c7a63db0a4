"""Column types of the wire contract: :class:`Kind`, :class:`ColumnType` (with its text form,
``int64`` or ``vector[float32,768]``), the ready-made scalar types and the ranges they hold."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

import numpy as np

from rowbatch.wire.errors import UnsupportedColumnType

MAX_VECTOR_DIM: Final = 1 << 20
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


class Kind(StrEnum):
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"
    STRING = "string"
    BYTES = "bytes"
    VECTOR = "vector"  # fixed-size vector of float32, ``dim`` elements


_NUMPY_DTYPES: Final[Mapping[Kind, np.dtype[Any]]] = MappingProxyType(
    {
        Kind.INT64: np.dtype(np.int64),
        Kind.FLOAT32: np.dtype(np.float32),
        Kind.FLOAT64: np.dtype(np.float64),
        Kind.BOOL: np.dtype(np.bool_),
        Kind.STRING: np.dtype(object),
        Kind.BYTES: np.dtype(object),
        Kind.VECTOR: np.dtype(np.float32),
    }
)

_TYPE_RE: Final = re.compile(r"\s*vector\s*\[\s*float32\s*,\s*(\d+)\s*\]\s*")


@dataclass(frozen=True)
class ColumnType:
    """A column's type: ``ColumnType(Kind.INT64)``, ``ColumnType.vector(768)``..."""

    kind: Kind
    dim: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        if self.kind is Kind.VECTOR:
            if (
                not isinstance(self.dim, int)
                or isinstance(self.dim, bool)
                or not 1 <= self.dim <= MAX_VECTOR_DIM
            ):
                raise UnsupportedColumnType(
                    f"vector dim must be an integer in [1, {MAX_VECTOR_DIM}], found {self.dim!r}",
                    expected=f"1..{MAX_VECTOR_DIM}",
                    found=repr(self.dim),
                )
        elif self.dim is not None:
            raise UnsupportedColumnType(
                f"only vector columns have a dim; {self.kind.value} has dim={self.dim!r}",
                expected="dim=None",
                found=repr(self.dim),
            )

    @classmethod
    def vector(cls, dim: int) -> ColumnType:
        return cls(Kind.VECTOR, dim)

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        """Parses ``str(column_type)``: ``int64``, ``string``, ``vector[float32,768]``..."""
        match = _TYPE_RE.fullmatch(text)
        if match:
            return cls.vector(int(match[1]))
        try:
            kind = Kind(text.strip())
        except ValueError:
            kind = Kind.VECTOR  # bare "vector" without dim is not a full type
        if kind is Kind.VECTOR:
            raise UnsupportedColumnType(
                f"unknown column type {text!r}; expected one of "
                f"{', '.join(k.value for k in Kind if k is not Kind.VECTOR)}, vector[float32,DIM]",
                found=text,
            )
        return cls(kind)

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return _NUMPY_DTYPES[self.kind]

    def __str__(self) -> str:
        if self.kind is Kind.VECTOR:
            return f"vector[float32,{self.dim}]"
        return self.kind.value


INT64: Final = ColumnType(Kind.INT64)
FLOAT32: Final = ColumnType(Kind.FLOAT32)
FLOAT64: Final = ColumnType(Kind.FLOAT64)
BOOL: Final = ColumnType(Kind.BOOL)
STRING: Final = ColumnType(Kind.STRING)
BYTES: Final = ColumnType(Kind.BYTES)


def vector_type(name: str, dim: object) -> ColumnType:
    """``ColumnType.vector(dim)``, with an error naming the column when ``dim`` is out of range."""
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_VECTOR_DIM:
        raise UnsupportedColumnType(
            f"column {name!r}: vector dim must be an integer in [1, {MAX_VECTOR_DIM}], "
            f"found {dim!r}",
            column=name,
            expected=f"1..{MAX_VECTOR_DIM}",
            found=repr(dim),
        )
    return ColumnType.vector(dim)
