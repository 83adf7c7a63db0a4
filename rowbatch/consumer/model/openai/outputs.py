"""What an OpenAI-compatible answer becomes: the outputs a binding may name, their types (as
tensors, so the result table is made as for any model), and each answered row's values.

- chat and completions: ``text``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
  ``model`` (the name the server answered with), ``latency_ms`` (the request's), and with a
  ``json_schema`` each top-level field as ``json.<field>``;
- embeddings: ``embedding`` (a float32 vector), ``prompt_tokens``, ``model``, ``latency_ms``;
- batch (each row a request of the OpenAI Batch API file format): ``response`` (the answer's
  JSON text, as the batch output file holds it), and as chat's ``text``, ``finish_reason``,
  ``prompt_tokens``, ``completion_tokens``, ``model``, ``latency_ms`` (the text and finish
  reason of the first choice; empty for an embeddings request).

Token counts come from the answer's ``usage``, which counts a request: they are per row only
when a request holds one row, so a binding that names them with ``rows_per_request > 1`` is
refused at start-up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson
from numpy.typing import NDArray

from rowbatch.consumer.model.answer import RowError
from rowbatch.consumer.model.spec import TensorSpec

USAGE_OUTPUTS: Final = frozenset({"prompt_tokens", "completion_tokens"})
_SCHEMA_TYPES: Final = {"string": "BYTES", "integer": "INT64", "number": "FP64", "boolean": "BOOL"}
_EMPTY: Final = {"BYTES": "", "INT64": 0, "FP64": 0.0, "BOOL": False, "FP32": 0.0}
_DTYPES: Final = {"BYTES": object, "INT64": np.int64, "FP64": np.float64, "BOOL": np.bool_}


def text_outputs(json_schema: Mapping[str, Any] | None) -> tuple[TensorSpec, ...]:
    """The outputs of a chat or completions model."""
    base = (
        TensorSpec("text", "BYTES", ()),
        TensorSpec("finish_reason", "BYTES", ()),
        TensorSpec("prompt_tokens", "INT64", ()),
        TensorSpec("completion_tokens", "INT64", ()),
        TensorSpec("model", "BYTES", ()),
        TensorSpec("latency_ms", "FP64", ()),
    )
    if json_schema is None:
        return base
    fields = tuple(
        TensorSpec(f"json.{name}", _SCHEMA_TYPES.get(str(prop.get("type")), "BYTES"), ())
        for name, prop in dict(json_schema["properties"]).items()
    )
    return base + fields


def embedding_outputs(dim: int) -> tuple[TensorSpec, ...]:
    """The outputs of an embeddings model of ``dim`` dimensions."""
    return (
        TensorSpec("embedding", "FP32", (dim,)),
        TensorSpec("prompt_tokens", "INT64", ()),
        TensorSpec("model", "BYTES", ()),
        TensorSpec("latency_ms", "FP64", ()),
    )


def batch_outputs() -> tuple[TensorSpec, ...]:
    """The outputs of ``api = "batch"``: the answer's JSON text, then chat's."""
    return (TensorSpec("response", "BYTES", ()), *text_outputs(None))


def batch_values(answer: Mapping[str, Any], *, model: str, latency_ms: float) -> dict[str, Any]:
    """A batch row's outputs from the server's ``answer`` to its request (chat, completions
    or embeddings: the first choice's text where there is one)."""
    prompt_tokens, completion_tokens = usage_of(answer)
    text, finish = "", ""
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        first = choices[0]
        got = choice_values(first, chat=isinstance(first.get("message"), Mapping), json_fields=())
        assert not isinstance(got, RowError)  # no fields to parse
        text, finish = got["text"], got["finish_reason"]
    return {
        "response": orjson.dumps(answer).decode(),
        "text": text,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "model": str(answer.get("model") or model),
        "latency_ms": latency_ms,
    }


@dataclass
class RowValues:
    """The bound outputs of a batch being answered, filled row by row."""

    specs: Sequence[TensorSpec]
    rows: int

    def __post_init__(self) -> None:
        self.columns: dict[str, NDArray[Any]] = {}
        for spec in self.specs:
            if spec.dims:
                self.columns[spec.name] = np.zeros((self.rows, *spec.dims), np.float32)
            else:
                array: NDArray[Any] = np.empty(self.rows, _DTYPES[spec.datatype])
                array[:] = _EMPTY[spec.datatype]
                self.columns[spec.name] = array

    def put(self, row: int, values: Mapping[str, Any]) -> None:
        for name, column in self.columns.items():
            column[row] = values[name]


def choice_values(
    choice: Mapping[str, Any], *, chat: bool, json_fields: Sequence[TensorSpec]
) -> dict[str, Any] | RowError:
    """One choice's text and finish reason (and parsed fields); a :class:`RowError` when its
    structured output does not parse."""
    if chat:
        message = choice.get("message") or {}
        text = message.get("content") if isinstance(message, Mapping) else None
    else:
        text = choice.get("text")
    text = "" if text is None else str(text)
    out: dict[str, Any] = {"text": text, "finish_reason": str(choice.get("finish_reason") or "")}
    if not json_fields:
        return out
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return RowError("unparseable_output", f"the answer is not JSON ({exc}): {text[:200]!r}")
    if not isinstance(parsed, dict):
        return RowError("unparseable_output", f"the answer is not a JSON object: {text[:200]!r}")
    for spec in json_fields:
        field = spec.name.removeprefix("json.")
        value = parsed.get(field)
        typed = _typed(value, spec.datatype)
        if typed is None:
            return RowError(
                "unparseable_output",
                f"field {field!r} of the answer is {value!r}, not a {spec.datatype} value",
            )
        out[spec.name] = typed
    return out


def _typed(value: Any, datatype: str) -> Any:
    if datatype == "BYTES":
        return value if isinstance(value, str) else None
    if datatype == "BOOL":
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if datatype == "INT64":
        return value if isinstance(value, int) else None
    return float(value) if isinstance(value, int | float) else None


def usage_of(answer: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens of an answer's ``usage`` (0 where it does not say)."""
    usage = answer.get("usage") or {}
    if not isinstance(usage, Mapping):
        return 0, 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
