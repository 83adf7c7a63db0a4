"""The chaos model's control file: validation, atomic writes, round trip."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.chaos import ChaosControl


def test_default_writes_empty_object(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "control.json"
    ChaosControl().write(path)
    assert json.loads(path.read_text()) == {}
    assert [p.name for p in path.parent.iterdir()] == ["control.json"]  # no temp file left


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    control = ChaosControl(
        unavailable_until=123.5, unavailable_fraction=0.5, delay_s=0.1, reject_marker="bad"
    )
    control.write(path)
    assert ChaosControl.read(path) == control
    assert ChaosControl.read(tmp_path / "missing.json") == ChaosControl()


def test_each_write_changes_what_the_model_watches(tmp_path: Path) -> None:
    path = tmp_path / "control.json"
    seen = set()
    for i in range(5):
        ChaosControl(delay_s=float(i)).write(path)
        st = path.stat()
        seen.add((st.st_ino, st.st_mtime_ns, st.st_size))
    assert len(seen) == 5


def test_unavailable_for() -> None:
    control = ChaosControl.unavailable_for(2.0)
    assert control.unavailable_until is not None
    assert 1.0 < control.unavailable_until - time.time() <= 2.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"unavailable_fraction": 1.5},
        {"unavailable_fraction": -0.1},
        {"delay_s": -1.0},
        {"reject_marker": ""},
    ],
)
def test_rejects_nonsense(kwargs: dict[str, float | str]) -> None:
    with pytest.raises(ValueError):
        ChaosControl(**kwargs)  # type: ignore[arg-type]
