"""The canonical form of a column (:class:`Column`), which
:func:`~rowbatch.wire.chunks.decode.decode_chunk` returns and both codecs write from, and the
checks every column value passes on its way in.

Canonical numpy form of a column (``Column.values``), one entry per row:

==========  ==================================  ===============================
kind        numpy array                         value at a null row
==========  ==================================  ===============================
int64       1-D ``int64``                       ``0``
float32     1-D ``float32``                     ``0.0``
float64     1-D ``float64``                     ``0.0``
bool        1-D ``bool``                        ``False``
string      1-D ``object`` of ``str``           ``None``
bytes       1-D ``object`` of ``bytes``         ``None``
vector      2-D ``float32`` (rows x dim)        a row of ``0.0``
==========  ==================================  ===============================

Nulls are carried by a separate boolean mask (``True`` = null), present only for columns that
have at least one null. NaN is a float value, never a null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.columns.column_type import ColumnType, Kind
from rowbatch.wire.errors import InvalidColumnName, InvalidValue

MAX_COLUMN_NAME_LEN: Final = 256


@dataclass(frozen=True, eq=False)
class Column:
    """One column in canonical form (see the module docstring). ``nulls`` is ``None`` when the
    column has no null; otherwise a bool array, ``True`` where the row is null."""

    name: str
    type: ColumnType
    values: NDArray[Any]
    nulls: NDArray[np.bool_] | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def slice(self, start: int, stop: int) -> Column:
        nulls = None if self.nulls is None else self.nulls[start:stop]
        if nulls is not None and not nulls.any():
            nulls = None
        return Column(self.name, self.type, self.values[start:stop], nulls)


def check_column_name(name: object) -> str:
    if not isinstance(name, str) or not 0 < len(name) <= MAX_COLUMN_NAME_LEN:
        raise InvalidColumnName(
            f"column name must be a non-empty string of at most {MAX_COLUMN_NAME_LEN} "
            f"characters, found {name!r}",
            column=str(name),
            expected=f"1..{MAX_COLUMN_NAME_LEN} characters",
            found=repr(name),
        )
    return name


def make_column(
    name: str, values: NDArray[Any], ctype: ColumnType, nulls: NDArray[np.bool_] | None
) -> Column:
    """Builds a canonical column: fills null rows, drops an all-false mask, and hands out
    read-only views (the caller's own arrays keep their flags)."""
    if nulls is not None:
        if nulls.any():
            values = fill_nulls(values, nulls, ctype)
            nulls = read_only(nulls)
        else:
            nulls = None
    return Column(name, ctype, read_only(values), nulls)


def read_only(arr: NDArray[Any]) -> NDArray[Any]:
    """``arr``, or a read-only view of it where it is writeable."""
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def fill_nulls(values: NDArray[Any], nulls: NDArray[np.bool_], ctype: ColumnType) -> NDArray[Any]:
    """A copy of ``values`` with null rows set to the documented fill value, unless they
    already hold it."""
    fill: object = None if ctype.kind in (Kind.STRING, Kind.BYTES) else 0
    sub = values[nulls]
    if fill is None:
        if all(v is None for v in sub):
            return values
    elif not sub.any() and not (sub.dtype.kind == "f" and np.signbit(sub).any()):
        return values  # already all zero (and no -0.0)
    out = values.copy()
    out[nulls] = fill
    return out


def checked_float32(name: str, wide: NDArray[Any]) -> NDArray[np.float32]:
    """Casts to float32, refusing finite values that would overflow to infinity."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = wide.astype(np.float32)
    if wide.dtype.kind == "f" and wide.dtype.itemsize > 4:
        finite = np.isfinite(out)
        if not finite.all():
            bad = ~finite & np.isfinite(wide)
            if bad.any():
                idx = np.argwhere(bad)[0]
                row = int(idx[0])
                raise InvalidValue(
                    f"column {name!r}: value {wide[tuple(idx)]!r} at row {row} is out of "
                    "float32 range",
                    column=name,
                    expected="|x| <= 3.4028235e38",
                    found=repr(wide[tuple(idx)]),
                )
    return out


def has_surrogate(value: object) -> bool:
    """Whether ``value`` is a string that UTF-8 cannot encode (it holds a lone surrogate)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
