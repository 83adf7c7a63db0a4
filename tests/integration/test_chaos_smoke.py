"""``python -m bench chaos --short --broker kafka`` on its own stack (the command starts and stops
every service itself): the JSON has one row per fault with every figure, every fault's verdict
is a pass (nothing lost or duplicated, dead letters as expected, no unexpected exit; see
docs/chaos.md), and the command says so with exit code 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.service import REPO_ROOT

FAULTS = {
    "kill-9",
    "slow-sink",
    "poison",
    "bytes-column",
    "triton-sigterm",
    "triton-sigkill",
    "postgres-restart",
}
ROW_KEYS = {
    "fault", "broker", "topic", "table", "messages_published", "rows_published",
    "rows_expected_written", "rows_written", "duplicated", "missing", "dead_letters_expected",
    "dead_letters_actual", "codes_expected", "codes_actual", "wrongly_dead_lettered",
    "wrong_reason", "poison_written", "messages_received", "redeliveries", "recovery_s",
    "exits", "unexpected_exits", "peak_rss_mib", "rss_limit_mib", "completed", "elapsed_s",
    "failures", "ok",
}  # fmt: skip


@pytest.mark.timeout(240)
def test_chaos_short_kafka_passes_every_fault_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "chaos", "--short", "--broker", "kafka", "--seed", "3",
         "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=225, check=False,
    )  # fmt: skip
    tail = done.stdout[-4000:] + done.stderr[-3000:]
    assert out.exists(), tail
    result = json.loads(out.read_text())
    assert result["run"]["short"] is True and result["run"]["brokers"] == ["kafka"]
    assert result["errors"] == {}, tail
    rows = {row["fault"]: row for row in result["faults"]}
    assert set(rows) == FAULTS, tail
    for row in rows.values():
        assert set(row) >= ROW_KEYS, set(ROW_KEYS) - set(row)
        assert row["broker"] == "kafka"
        assert row["rows_published"] > 0 and row["messages_published"] > 0
        assert row["ok"] == (not row["failures"])
    failed = {name: row["failures"] for name, row in rows.items() if not row["ok"]}
    assert failed == {}, tail
    assert result["ok"] is True, tail
    assert done.returncode == 0, tail

    kill = rows["kill-9"]
    assert kill["missing"] == 0 and kill["duplicated"] == 0, kill
    assert kill["rows_written"] == kill["rows_expected_written"] == kill["rows_published"]
    assert [e["code"] for e in kill["exits"] if e["expected"]] == [-9, -9]
    assert kill["unexpected_exits"] == 0, kill["exits"]
    assert kill["wrongly_dead_lettered"] == 0

    poison = rows["poison"]
    assert sum(poison["dead_letters_expected"].values()) == 8  # one of each kind
    assert result["elapsed_s"]["total"] > 0
