"""Every way a chunk can be wrong raises a typed WireError naming what is wrong; never a bare
exception, never a silent drop or coercion."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowbatch.wire import errors
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodeOptions, encode_chunk
from rowbatch.wire.columns.column_type import FLOAT32, INT64, STRING, ColumnType
from rowbatch.wire.columns.schema import TableSchema
from rowbatch.wire.errors import (
    ColumnLengthMismatch,
    ColumnTypeMismatch,
    CorruptArrow,
    DuplicateColumn,
    InvalidColumnName,
    InvalidHeader,
    InvalidJson,
    InvalidValue,
    MissingColumn,
    MissingHeader,
    NoColumns,
    NullNotAllowed,
    RowCountMismatch,
    UnsupportedColumnType,
    UnsupportedContentType,
    UnsupportedFormatVersion,
    WireError,
)
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import Encoding, kafka_headers_to_attributes
from tests.unit.wire.helpers import masked

JSON = Encoding.JSON.value
ARROW = Encoding.ARROW.value


def attrs(content_type: str = JSON, rows: int = 2, **overrides: str) -> dict[str, str]:
    base = {
        "rowbatch-format-version": "1",
        "content-type": content_type,
        "rowbatch-chunk-id": "chunk-1",
        "rowbatch-table": "orders",
        "rowbatch-row-count": str(rows),
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }
    base.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return base


def json_payload(*columns: dict[str, Any]) -> bytes:
    return json.dumps({"columns": list(columns)}).encode()


GOOD_JSON = json_payload({"name": "a", "type": "int64", "values": [1, 2]})


def arrow_payload(*arrays: tuple[str, pa.Array]) -> bytes:
    batch = pa.record_batch([a for _, a in arrays], names=[n for n, _ in arrays])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


GOOD_ARROW = arrow_payload(("a", pa.array([1, 2], pa.int64())))


def test_reasons_are_unique_snake_case_strings() -> None:
    classes = [
        cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, WireError)
    ]
    reasons = [cls.reason for cls in classes]
    assert len(set(reasons)) == len(reasons), reasons
    for reason in reasons:
        assert reason.replace("_", "").isalpha() and reason.islower()
    assert all(issubclass(cls, ValueError) for cls in classes)


# --- headers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        "rowbatch-format-version",
        "content-type",
        "rowbatch-chunk-id",
        "rowbatch-table",
        "rowbatch-row-count",
        "rowbatch-produced-at",
    ],
)
def test_missing_header(header: str) -> None:
    attributes = attrs()
    del attributes[header]
    with pytest.raises(MissingHeader, match=header) as info:
        decode_chunk(GOOD_JSON, attributes)
    assert info.value.header == header
    assert info.value.reason == "missing_header"


@pytest.mark.parametrize("version", ["2", "0", "", "1.0", "v1"])
def test_unsupported_format_version(version: str) -> None:
    with pytest.raises(UnsupportedFormatVersion, match="rowbatch-format-version") as info:
        decode_chunk(GOOD_JSON, attrs(rowbatch_format_version=version))
    assert info.value.found == version.strip()
    assert info.value.expected == "1"


@pytest.mark.parametrize(
    "content_type",
    [
        "text/csv",
        "application/x-protobuf",
        "",
        "application/json; charset=latin-1",
        "application/vnd.apache.arrow.file",
        "application/vnd.apache.arrow.stream; charset=utf-8",
    ],
)
def test_unsupported_content_type(content_type: str) -> None:
    with pytest.raises(UnsupportedContentType, match="content-type") as info:
        decode_chunk(GOOD_JSON, attrs(content_type))
    assert info.value.header == "content-type"


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "Application/JSON", "application/json "]
)
def test_content_type_variants_accepted(content_type: str) -> None:
    decoded = decode_chunk(GOOD_JSON, attrs(content_type))
    assert decoded.headers.content_type is Encoding.JSON


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("rowbatch-row-count", "two"),
        ("rowbatch-row-count", "-1"),
        ("rowbatch-row-count", "02"),
        ("rowbatch-row-count", "2.0"),
        ("rowbatch-row-count", ""),
        ("rowbatch-produced-at", "yesterday"),
        ("rowbatch-produced-at", "2024-05-01 12:34:56Z"),
        ("rowbatch-produced-at", "2024-05-01T12:34:56"),
        ("rowbatch-produced-at", "2024-13-01T12:34:56.000Z"),
        ("rowbatch-chunk-id", ""),
        ("rowbatch-chunk-id", "has space"),
        ("rowbatch-chunk-id", "x" * 257),
        ("rowbatch-chunk-id", "caf\u00e9"),
        ("rowbatch-table", ""),
        ("rowbatch-table", "-leading-dash"),
        ("rowbatch-table", "semi;colon"),
        ("rowbatch-table", "t" * 129),
    ],
)
def test_invalid_header_values(header: str, value: str) -> None:
    attributes = attrs()
    attributes[header] = value
    with pytest.raises(InvalidHeader, match=header) as info:
        decode_chunk(GOOD_JSON, attributes)
    assert info.value.header == header
    assert info.value.reason == "invalid_header"


def test_header_names_match_case_insensitively_and_unknown_are_ignored() -> None:
    attributes = {k.upper(): v for k, v in attrs().items()}
    attributes["googclient_schemarevisionid"] = "abc"
    decoded = decode_chunk(GOOD_JSON, attributes)
    assert decoded.headers.chunk_id == "chunk-1"


def test_conflicting_header_spellings_are_rejected() -> None:
    attributes = attrs()
    attributes["Content-Type"] = ARROW
    with pytest.raises(InvalidHeader, match="content-type"):
        decode_chunk(GOOD_JSON, attributes)


def test_kafka_headers_not_utf8_or_conflicting() -> None:
    with pytest.raises(InvalidHeader, match="rowbatch-table"):
        kafka_headers_to_attributes([("rowbatch-table", b"\xff\xfe")])
    with pytest.raises(InvalidHeader, match="rowbatch-table"):
        kafka_headers_to_attributes([("rowbatch-table", b"a"), ("rowbatch-table", b"b")])
    same = kafka_headers_to_attributes([("k", b"a"), ("k", b"a"), ("n", None)])
    assert same == {"k": "a", "n": ""}


def test_chunk_headers_validate_on_construction() -> None:
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(InvalidHeader, match="rowbatch-produced-at"):
        ChunkHeaders("c", "t", 1, Encoding.JSON, dt.datetime(2024, 1, 1))  # naive
    with pytest.raises(InvalidHeader, match="rowbatch-row-count"):
        ChunkHeaders("c", "t", -1, Encoding.JSON, now)
    with pytest.raises(InvalidHeader, match="rowbatch-ordering-key"):
        ChunkHeaders("c", "t", 1, Encoding.JSON, now, ordering_key="k" * 1025)
    with pytest.raises(InvalidHeader, match="rowbatch-chunk-id"):
        encode_chunk("t", {"a": [1]}, "json", "white space")
    with pytest.raises(InvalidHeader, match="rowbatch-table"):
        encode_chunk("bad table", {"a": [1]}, "json", "c")
    with pytest.raises(UnsupportedFormatVersion):
        ChunkHeaders("c", "t", 1, Encoding.JSON, now, format_version="2")
    with pytest.raises(UnsupportedContentType):
        encode_chunk("t", {"a": [1]}, "csv", "c")


# --- JSON payloads ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"", "not valid JSON"),
        (b"{not json", "not valid JSON"),
        (b'{"columns": [}', "not valid JSON"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"[]", "exactly the member 'columns'"),
        (b'"columns"', "exactly the member 'columns'"),
        (b"{}", "exactly the member 'columns'"),
        (b'{"columns": [], "rows": []}', "exactly the member 'columns'"),
        (b'{"rows": [{"a": 1}]}', "exactly the member 'columns'"),
        (b'{"columns": {"a": [1, 2]}}', "must be an array"),
        (b'{"columns": [[1, 2]]}', r"columns\[0\] must be an object"),
        (b'{"columns": [{"name": "a", "type": "int64"}]}', "missing member"),
        (b'{"columns": [{"name": "a", "type": "int64", "values": [1], "x": 1}]}', "unknown"),
        (b'{"columns": [{"name": 1, "type": "int64", "values": [1, 2]}]}', "'name' must be"),
        (b'{"columns": [{"name": "a", "type": "int64", "values": "12"}]}', "'values' must be"),
        (b'{"columns": [{"name": "a", "type": "vector", "values": [[1], [2]]}]}', "needs an"),
        (b'{"columns": [{"name": "a", "type": "vector", "dim": "1", "values": []}]}', "needs"),
        (b'{"columns": [{"name": "a", "type": "int64", "dim": 1, "values": [1, 2]}]}', "only"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"columns": [], "columns": []}', "duplicate member 'columns'"),
        (
            b'{"columns": [{"name": "a", "name": "b", "type": "int64", "values": [1, 2]}]}',
            "duplicate member 'name'",
        ),
        (b"\xef\xbb\xbf[]", "exactly the member 'columns'"),  # a BOM is skipped
    ],
)
def test_invalid_json(payload: bytes, needle: str) -> None:
    with pytest.raises(InvalidJson, match=needle) as info:
        decode_chunk(payload, attrs())
    assert info.value.reason == "invalid_json"


def test_json_row_count_mismatch() -> None:
    with pytest.raises(RowCountMismatch, match="rowbatch-row-count") as info:
        decode_chunk(GOOD_JSON, attrs(rows=3))
    assert (info.value.expected, info.value.found) == ("3", "2")


def test_json_column_length_mismatch() -> None:
    payload = json_payload(
        {"name": "a", "type": "int64", "values": [1, 2]},
        {"name": "b", "type": "string", "values": ["x"]},
    )
    with pytest.raises(ColumnLengthMismatch, match="'b' has 1 rows but column 'a' has 2"):
        decode_chunk(payload, attrs())


def test_json_duplicate_column() -> None:
    payload = json_payload(
        {"name": "a", "type": "int64", "values": [1, 2]},
        {"name": "a", "type": "int64", "values": [1, 2]},
    )
    with pytest.raises(DuplicateColumn, match="'a'"):
        decode_chunk(payload, attrs())


def test_json_empty_column_name_and_no_columns() -> None:
    with pytest.raises(InvalidColumnName):
        decode_chunk(json_payload({"name": "", "type": "int64", "values": [1, 2]}), attrs())
    with pytest.raises(NoColumns):
        decode_chunk(b'{"columns": []}', attrs(rows=0))


@pytest.mark.parametrize(
    ("ctype", "values", "needle"),
    [
        ("int64", [1, 2.5], "row 1 holds JSON number 2.5"),
        ("int64", [1, 2.0], "row 1 holds JSON number 2.0"),
        ("int64", [True, 1], "row 0 holds JSON boolean True"),
        ("int64", [1, "2"], "row 1 holds JSON string"),
        ("float64", [1.5, True], "row 1 holds JSON boolean"),
        ("float32", [1.5, "1.5"], "row 1 holds the string '1.5'"),
        ("float64", [[1.0], 2.0], "row 0 holds JSON array"),
        ("bool", [1, 0], "row 0 holds JSON integer"),
        ("bool", ["true", False], "row 0 holds JSON string"),
        ("string", ["a", 1], "row 1 holds JSON integer"),
        ("string", ["a", {"b": 1}], "row 1 holds JSON object"),
        ("bytes", ["YQ==", 5], "row 1 holds JSON integer"),
    ],
)
def test_json_value_type_mismatch(ctype: str, values: list[Any], needle: str) -> None:
    payload = json_payload({"name": "col", "type": ctype, "values": values})
    with pytest.raises(ColumnTypeMismatch, match=needle) as info:
        decode_chunk(payload, attrs())
    assert info.value.column == "col"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ([[1.0, 2.0], [1.0]], "row 1 has 1 elements, expected 2"),
        ([[1.0, 2.0], 3.0], "row 1 holds JSON number"),
        ([[1.0, True], [1.0, 2.0]], "row 0 holds a JSON boolean"),
        ([[1.0, 2.0], [1.0, "x"]], "row 1 holds the string 'x'"),
        ([[1.0, 2.0], [[1.0], 2.0]], "row 1 holds a JSON array"),
    ],
)
def test_json_vector_mismatch(values: list[Any], needle: str) -> None:
    payload = json_payload({"name": "v", "type": "vector", "dim": 2, "values": values})
    with pytest.raises(ColumnTypeMismatch, match=needle):
        decode_chunk(payload, attrs())


@pytest.mark.parametrize(
    ("ctype", "values", "needle"),
    [
        ("int64", [1, 2**63], "out of int64 range"),
        ("int64", [-(2**63) - 1, 0], "out of int64 range"),
        ("float32", [1.0, 1e39], "out of float32 range"),
        ("float64", [1.0, 10**400], "out of range"),
        ("bytes", ["YQ==", "not base64!"], "row 1 is not valid standard base64"),
        ("bytes", ["YQ", "YQ=="], "row 0 is not valid standard base64"),
    ],
)
def test_json_invalid_values(ctype: str, values: list[Any], needle: str) -> None:
    payload = json_payload({"name": "col", "type": ctype, "values": values})
    with pytest.raises(InvalidValue, match=needle) as info:
        decode_chunk(payload, attrs())
    assert info.value.column == "col"


def test_json_null_inside_vector() -> None:
    payload = json_payload({"name": "v", "type": "vector", "dim": 2, "values": [[1, 2], [None, 2]]})
    with pytest.raises(InvalidValue, match="row 1 has a null element"):
        decode_chunk(payload, attrs())


def test_json_vector_float32_overflow() -> None:
    payload = json_payload({"name": "v", "type": "vector", "dim": 1, "values": [[1.0], [1e39]]})
    with pytest.raises(InvalidValue, match="row 1 is out of float32 range"):
        decode_chunk(payload, attrs())


@pytest.mark.parametrize("type_name", ["int32", "decimal", "timestamp", "", 5, None, "VECTOR"])
def test_json_unknown_type(type_name: object) -> None:
    payload = json_payload({"name": "a", "type": type_name, "values": [1, 2]})
    with pytest.raises(UnsupportedColumnType, match="unknown type") as info:
        decode_chunk(payload, attrs())
    assert info.value.column == "a"


@pytest.mark.parametrize("dim", [0, -1, 2**20 + 1])
def test_json_vector_dim_out_of_range(dim: int) -> None:
    payload = json_payload({"name": "v", "type": "vector", "dim": dim, "values": [[], []]})
    with pytest.raises(UnsupportedColumnType, match="column 'v': vector dim") as info:
        decode_chunk(payload, attrs())
    assert info.value.column == "v"


def test_arrow_vector_dim_zero() -> None:
    payload = arrow_payload(("v", pa.array([[], []], type=pa.list_(pa.float32(), 0))))
    with pytest.raises(UnsupportedColumnType, match="column 'v': vector dim"):
        decode_chunk(payload, attrs(ARROW))


@pytest.mark.parametrize(
    "value", ["9999-12-31T23:59:59.000-05:00", "0001-01-01T00:00:00.000+05:00"]
)
def test_produced_at_out_of_range_is_an_invalid_header(value: str) -> None:
    with pytest.raises(InvalidHeader, match="rowbatch-produced-at"):
        decode_chunk(GOOD_JSON, attrs(rowbatch_produced_at=value))


# --- Arrow payloads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [b"", b"garbage", b"\xff" * 64, GOOD_JSON, b"ARROW1\x00\x00" + GOOD_ARROW],
    ids=["empty", "text", "ff", "json", "file-magic"],
)
def test_not_arrow(payload: bytes) -> None:
    with pytest.raises(CorruptArrow, match="not a valid Arrow IPC stream") as info:
        decode_chunk(payload, attrs(ARROW))
    assert info.value.reason == "corrupt_arrow"


def test_truncated_arrow_is_always_a_wire_error() -> None:
    kinds = set()
    for cut in range(len(GOOD_ARROW)):
        try:
            decode_chunk(GOOD_ARROW[:cut], attrs(ARROW))
        except WireError as exc:
            kinds.add(type(exc))
        else:  # only the 8-byte end-of-stream marker is optional
            assert cut >= len(GOOD_ARROW) - 8
    assert CorruptArrow in kinds
    assert kinds <= {CorruptArrow, RowCountMismatch}


def test_arrow_cut_between_batches_is_a_row_count_mismatch() -> None:
    schema = pa.schema([("a", pa.int64())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.record_batch([pa.array([1, 2])], schema=schema))
        first = sink.tell()
        writer.write_batch(pa.record_batch([pa.array([3])], schema=schema))
    whole = sink.getvalue().to_pybytes()
    assert decode_chunk(whole, attrs(ARROW, rows=3)).row_count == 3
    with pytest.raises(RowCountMismatch, match="says 3 rows but the payload has 2"):
        decode_chunk(whole[:first], attrs(ARROW, rows=3))


def test_arrow_trailing_bytes() -> None:
    with pytest.raises(CorruptArrow, match="5 unexpected byte"):
        decode_chunk(GOOD_ARROW + b"extra", attrs(ARROW))


def test_arrow_corrupt_string_offsets_are_caught() -> None:
    payload = bytearray(arrow_payload(("s", pa.array(["ab", "cd"], pa.string()))))
    # The offsets buffer holds int32 [0, 2, 4]; make the last one point past the data.
    needle = np.array([0, 2, 4], dtype=np.int32).tobytes()
    at = bytes(payload).index(needle)
    payload[at + 8 : at + 12] = np.array([4000], dtype=np.int32).tobytes()
    with pytest.raises(CorruptArrow):
        decode_chunk(bytes(payload), attrs(ARROW))


def test_arrow_invalid_utf8_is_caught() -> None:
    payload = arrow_payload(
        ("s", pa.array([b"ok", b"\xff\xfe"], pa.binary()).cast(pa.string(), safe=False))
    )
    with pytest.raises(CorruptArrow, match=r"(?i)utf-?8"):
        decode_chunk(payload, attrs(ARROW))


def test_arrow_row_count_mismatch() -> None:
    with pytest.raises(RowCountMismatch):
        decode_chunk(GOOD_ARROW, attrs(ARROW, rows=5))


def test_arrow_duplicate_and_empty_names_and_no_columns() -> None:
    dup = arrow_payload(("a", pa.array([1, 2])), ("a", pa.array([3, 4])))
    with pytest.raises(DuplicateColumn, match="'a' appears 2 times"):
        decode_chunk(dup, attrs(ARROW))
    empty_name = arrow_payload(("", pa.array([1, 2])))
    with pytest.raises(InvalidColumnName):
        decode_chunk(empty_name, attrs(ARROW))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([])):
        pass
    with pytest.raises(NoColumns):
        decode_chunk(sink.getvalue().to_pybytes(), attrs(ARROW, rows=0))


@pytest.mark.parametrize(
    "array",
    [
        pa.array([1, 2], pa.timestamp("us")),
        pa.array([1, 2], pa.uint64()),
        pa.array([1.0, 2.0], pa.float16())
        if hasattr(pa, "float16")
        else pa.array([1, 2], pa.date32()),
        pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float32())),
        pa.array([[1.0], [2.0]], pa.list_(pa.float64(), 1)),
        pa.array([{"x": 1}, {"x": 2}]),
        pa.array([1, 2], pa.decimal128(5, 2)),
        pa.array([None, None], pa.null()),
    ],
    ids=["timestamp", "uint64", "half", "list", "fsl-f64", "struct", "decimal", "null"],
)
def test_arrow_unsupported_types(array: pa.Array) -> None:
    with pytest.raises(UnsupportedColumnType, match="'c': Arrow type") as info:
        decode_chunk(arrow_payload(("c", array)), attrs(ARROW))
    assert info.value.column == "c"


def test_arrow_null_inside_vector() -> None:
    inner = pa.array([1.0, None, 3.0, 4.0], pa.float32())
    vectors = pa.FixedSizeListArray.from_arrays(inner, 2)
    with pytest.raises(InvalidValue, match="row 0 has a null element"):
        decode_chunk(arrow_payload(("v", vectors)), attrs(ARROW))
    # A null element under a null row is fine: the row is null as a whole.
    masked = pa.FixedSizeListArray.from_arrays(inner, 2, mask=pa.array([True, False]))
    decoded = decode_chunk(arrow_payload(("v", masked)), attrs(ARROW))
    assert decoded.columns["v"].tolist() == [[0.0, 0.0], [3.0, 4.0]]
    assert decoded.null_masks["v"].tolist() == [True, False]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_payloads_never_escape_as_other_exceptions(data: st.DataObject) -> None:
    encoding = data.draw(st.sampled_from([Encoding.JSON, Encoding.ARROW]))
    columns = {
        "i": [1, None, 3],
        "s": ["a", "bé", None],
        "v": [[1.0, 2.0], None, [3.0, 4.0]],
        "b": [True, False, None],
    }
    good = encode_chunk("t", columns, encoding, "f")
    payload = bytearray(good.payload)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    try:
        decoded = decode_chunk(bytes(payload[:cut]), good.attributes)
    except WireError as exc:
        assert exc.reason
        assert str(exc)
    else:
        assert decoded.row_count == 3


# --- schema checks ----------------------------------------------------------------------------

SCHEMA = TableSchema(
    {"id": INT64, "text": STRING, "emb": ColumnType.vector(2)}, non_nullable=frozenset({"emb"})
)


@pytest.mark.parametrize("encoding", ["json", "arrow"])
def test_schema_checks(encoding: str) -> None:
    good = {"id": [1, 2], "text": ["a", None], "emb": [[1, 2], [3, 4]], "extra": [True, False]}
    chunk = encode_chunk("t", good, encoding, "s")
    decoded = decode_chunk(chunk.payload, chunk.attributes, schema=SCHEMA)
    assert "extra" in decoded.columns  # extra columns pass through

    missing = encode_chunk("t", {"id": [1], "text": ["a"]}, encoding, "s")
    with pytest.raises(MissingColumn, match="'emb'") as info:
        decode_chunk(missing.payload, missing.attributes, schema=SCHEMA)
    assert info.value.expected == "vector[float32,2]"

    wrong = encode_chunk("t", {"id": [1.0], "text": ["a"], "emb": [[1, 2]]}, encoding, "s")
    with pytest.raises(ColumnTypeMismatch, match="'id': expected type int64, found float64"):
        decode_chunk(wrong.payload, wrong.attributes, schema=SCHEMA)

    wrong_dim = encode_chunk("t", {"id": [1], "text": ["a"], "emb": [[1, 2, 3]]}, encoding, "s")
    with pytest.raises(ColumnTypeMismatch, match=r"vector\[float32,2\], found vector\[float32,3\]"):
        decode_chunk(wrong_dim.payload, wrong_dim.attributes, schema=SCHEMA)

    null_emb = encode_chunk(
        "t", {"id": [1, 2], "text": ["a", "b"], "emb": [[1, 2], None]}, encoding, "s"
    )
    with pytest.raises(NullNotAllowed, match="'emb' is non-nullable but row 1 is null"):
        decode_chunk(null_emb.payload, null_emb.attributes, schema=SCHEMA)


def test_schema_as_plain_mapping_and_bad_non_nullable() -> None:
    chunk = encode_chunk("t", {"x": [1.5]}, "json", "s")
    with pytest.raises(ColumnTypeMismatch):
        decode_chunk(chunk.payload, chunk.attributes, schema={"x": FLOAT32})
    with pytest.raises(MissingColumn, match="non_nullable"):
        TableSchema({"x": FLOAT32}, non_nullable=frozenset({"y"}))


# --- encode-side errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (np.array([1 + 2j]), "complex128"),
        (np.zeros((2, 2, 2)), "3-D"),
        (np.array(["2024-01-01"], dtype="datetime64[D]"), "datetime64"),
        (np.zeros((2, 0)), "2-D"),
        (np.array([1.0], dtype=np.longdouble), "float128|longdouble"),
        ([{"a": 1}], "dict"),
        ([dt.date(2024, 1, 1)], "date"),
        ([1, "a"], "int, str"),
        ([None, None], "cannot infer"),
        ([], "cannot infer"),
        ("abc", "found str"),
        ({"a": 1}, "found dict"),
        (42, "found int"),
    ],
)
def test_encode_unsupported_column_type(data: Any, needle: str) -> None:
    with pytest.raises(UnsupportedColumnType, match=needle) as info:
        encode_chunk("t", {"c": data}, "json", "e")
    assert info.value.column == "c"


@pytest.mark.parametrize(
    ("data", "ctype", "needle"),
    [
        ([1.5], INT64, "row 0 holds float"),
        ([True], INT64, "row 0 holds bool"),
        (["1"], FLOAT32, "row 0 holds str"),
        ([1], STRING, "row 0 holds int"),
        (np.array([1.5]), INT64, "declared int64"),
        (np.array(["a"]), FLOAT32, "declared float32"),
        (np.zeros((2, 3)), ColumnType.vector(4), r"declared vector\[float32,4\]"),
        ([[1.0, 2.0], [1.0]], None, "row 1 has 1 elements, expected 2"),
        ([[1.0, "x"]], None, "row 0 element 1 is str"),
        (pa.array([1, 2]), STRING, "declared string, but the Arrow data is int64"),
    ],
)
def test_encode_type_mismatch(data: Any, ctype: ColumnType | None, needle: str) -> None:
    schema = {"c": ctype} if ctype is not None else None
    with pytest.raises(ColumnTypeMismatch, match=needle):
        encode_chunk("t", {"c": data}, "arrow", "e", schema=schema)


@pytest.mark.parametrize("encoding", ["json", "arrow"])
def test_encode_invalid_values(encoding: str) -> None:
    with pytest.raises(InvalidValue, match="row 1 is not encodable as UTF-8"):
        encode_chunk("t", {"s": ["ok", "bad \ud800 surrogate"]}, encoding, "e")
    with pytest.raises(InvalidValue, match="out of int64 range"):
        encode_chunk("t", {"i": [1, 2**64]}, encoding, "e")
    with pytest.raises(InvalidValue, match="out of int64 range"):
        encode_chunk("t", {"i": np.array([2**64 - 1], dtype=np.uint64)}, encoding, "e")
    with pytest.raises(InvalidValue, match="out of float32 range"):
        encode_chunk("t", {"f": np.array([1e300])}, encoding, "e", schema={"f": FLOAT32})
    partial = masked(np.zeros((2, 2)), [[True, False], [False, False]])
    with pytest.raises(InvalidValue, match="row 0 masks only some vector elements"):
        encode_chunk("t", {"v": partial}, encoding, "e")
    with pytest.raises(InvalidValue, match="null mask has shape"):
        encode_chunk("t", {"a": [1, 2]}, encoding, "e", null_masks={"a": [True]})


def test_encode_structural_errors() -> None:
    with pytest.raises(ColumnLengthMismatch, match="'b' has 1 rows but column 'a' has 2"):
        encode_chunk("t", {"a": [1, 2], "b": [1]}, "arrow", "e")
    with pytest.raises(NoColumns):
        encode_chunk("t", {}, "arrow", "e")
    with pytest.raises(InvalidColumnName):
        encode_chunk("t", {"": [1]}, "arrow", "e")
    with pytest.raises(MissingColumn, match="null_masks names"):
        encode_chunk("t", {"a": [1]}, "arrow", "e", null_masks={"b": [True]})
    with pytest.raises(MissingColumn, match="'b'"):
        encode_chunk("t", {"a": [1]}, "arrow", "e", schema={"a": INT64, "b": INT64})
    with pytest.raises(NullNotAllowed):
        encode_chunk(
            "t",
            {"a": [1, None]},
            "arrow",
            "e",
            schema=TableSchema({"a": INT64}, non_nullable=frozenset({"a"})),
        )
    with pytest.raises(ValueError, match="Arrow encoding only"):
        encode_chunk("t", {"a": [1]}, "json", "e", options=EncodeOptions(compression="zstd"))


def test_column_type_parse() -> None:
    assert ColumnType.parse("vector[float32, 768]") == ColumnType.vector(768)
    assert ColumnType.parse("int64") == INT64
    assert str(ColumnType.vector(3)) == "vector[float32,3]"
    for bad in ("vector", "int32", "vector[float64,3]"):
        with pytest.raises(UnsupportedColumnType, match="unknown column type"):
            ColumnType.parse(bad)
    with pytest.raises(UnsupportedColumnType):
        ColumnType(INT64.kind, dim=3)


def test_b64_helper_sanity() -> None:
    # The JSON bytes encoding is plain standard base64 with padding.
    chunk = encode_chunk("t", {"b": [b"\xfb\xff"]}, "json", "e")
    assert base64.b64encode(b"\xfb\xff").decode() in chunk.payload.decode()


def test_json_lone_surrogate_escapes_are_rejected() -> None:
    payload = json_payload({"name": "s", "type": "string", "values": ["ok", "bad \ud800"]})
    assert b"\\ud800" in payload
    with pytest.raises(InvalidValue, match="row 1 is not valid Unicode"):
        decode_chunk(payload, attrs())
    name = json_payload({"name": "\udc00", "type": "int64", "values": [1, 2]})
    with pytest.raises(InvalidColumnName, match="not valid Unicode"):
        decode_chunk(name, attrs())
    pair = json_payload({"name": "s", "type": "string", "values": ["\U0001f600", None]})
    assert b"\\ud83d\\ude00" in pair
    assert decode_chunk(pair, attrs()).columns["s"].tolist() == ["\U0001f600", None]
