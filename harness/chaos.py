"""Run-time fault control for the ``chaos`` Triton test model (``deploy/models/chaos``).

The model re-reads the JSON file named by ``$ROWBATCH_CHAOS_CONTROL`` (which
:class:`harness.triton.TritonService` sets on the server) whenever the file changes, so a test
changes the server's behaviour with ``ChaosControl(reject_marker="poison").write(path)`` and
undoes it with ``ChaosControl().write(path)``. Writes are atomic (temporary file + rename)
and stamp a fresh nanosecond mtime, so two writes in quick succession are both seen.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CONTROL_ENV = "ROWBATCH_CHAOS_CONTROL"


@dataclass(frozen=True)
class ChaosControl:
    """Faults the ``chaos`` model injects; the default injects none.

    - ``unavailable_until``: unix time; every request answers UNAVAILABLE until then.
    - ``unavailable_fraction``: 0..1; that share of requests answers UNAVAILABLE,
      deterministically (every ``1/fraction``-th request, counted from the last write).
    - ``delay_s``: the model sleeps this long per batch execute.
    - ``reject_marker``: a request whose TEXT contains it answers INVALID_ARGUMENT.
    """

    unavailable_until: float | None = None
    unavailable_fraction: float = 0.0
    delay_s: float = 0.0
    reject_marker: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.unavailable_fraction <= 1.0:
            raise ValueError(
                f"unavailable_fraction must be in [0, 1], not {self.unavailable_fraction}"
            )
        if self.delay_s < 0.0:
            raise ValueError(f"delay_s must be >= 0, not {self.delay_s}")
        if self.reject_marker == "":
            raise ValueError("reject_marker must not be empty (it would match every text)")

    @classmethod
    def unavailable_for(cls, seconds: float) -> ChaosControl:
        """Every request answers UNAVAILABLE for the next ``seconds``."""
        return cls(unavailable_until=time.time() + seconds)

    def to_json(self) -> dict[str, Any]:
        """The control file's content: only the keys that differ from "no fault"."""
        return {k: v for k, v in asdict(self).items() if v not in (None, 0.0)}

    def write(self, path: Path) -> None:
        """Replace the control file atomically; the model sees it on its next execute."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), sort_keys=True), encoding="utf-8")
        now = time.time_ns()
        os.utime(tmp, ns=(now, now))
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> ChaosControl:
        """The control currently in ``path`` (no faults if the file does not exist)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        return cls(**data)
