"""What the load generator sent (:class:`Manifest`): messages, rows, and each malformed chunk
with its kind and expected dead-letter reason, for tests to assert on (``--manifest PATH``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rowbatch.producer.loadgen.plan import PlannedMessage
from rowbatch.producer.loadgen.spec import LoadSpec, MalformedKind
from rowbatch.wire.headers.fields import Encoding


@dataclass
class Manifest:
    """What the load generator sent, for tests to assert on (``--manifest PATH``)."""

    spec: LoadSpec
    messages: int = 0
    rows: int = 0
    valid_rows: int = 0
    malformed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, planned: PlannedMessage) -> None:
        self.messages += 1
        self.rows += planned.rows
        if planned.kind is None:
            self.valid_rows += planned.rows
            return
        entry: dict[str, Any] = {
            "kind": planned.kind.value,
            "reason": planned.reason,
            "rows": planned.rows,
            "first_id": planned.first_id,
        }
        if planned.kind is MalformedKind.WRONG_TYPE:
            entry["needs_schema"] = self.spec.encoding is Encoding.ARROW
        if planned.marker_id is not None:
            entry["marker_id"] = planned.marker_id
        self.malformed[planned.chunk_id] = entry

    def to_json(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "spec": self.spec.to_json(),
            "schema": {name: str(t) for name, t in self.spec.schema().items()},
            "messages": self.messages,
            "rows": self.rows,
            "valid_rows": self.valid_rows,
            "malformed": dict(sorted(self.malformed.items())),
            "summary": dict(summary or {}),
        }


__all__ = ["Manifest"]
