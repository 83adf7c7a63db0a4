"""Temporary Triton model repositories built from ``deploy/models/fixed_latency``: the same model
under other names, with another execution time or ``max_batch_size``, so tests and benchmarks
can run replicas that are slower than each other or configured differently."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.service import REPO_ROOT

FIXED_LATENCY = REPO_ROOT / "deploy" / "models" / "fixed_latency"


@dataclass(frozen=True)
class FixedLatency:
    """One ``fixed_latency`` variant: each execution lasts ``base_ms + per_row_us x rows``."""

    base_ms: float
    per_row_us: float = 0.0
    max_batch_size: int = 256
    instances: int = 1
    """Model instances (executions side by side): the template's ``instance_group`` count."""

    def batch_s(self, rows: int) -> float:
        return self.base_ms / 1e3 + self.per_row_us / 1e6 * rows

    def ceiling(self) -> float:
        """Rows/s of one instance at full batches (all of them: ``instances`` x this)."""
        return self.max_batch_size / self.batch_s(self.max_batch_size)


def _set(config: str, pattern: str, value: str) -> str:
    changed, count = re.subn(pattern, lambda m: m.group(1) + value, config, count=1)
    if count != 1:
        raise ValueError(f"{FIXED_LATENCY}/config.pbtxt has no {pattern!r} to set")
    return changed


def fixed_latency_repository(root: Path, models: Mapping[str, FixedLatency]) -> Path:
    """``root`` as a model repository holding each of ``models`` (name -> variant)."""
    template = (FIXED_LATENCY / "config.pbtxt").read_text(encoding="utf-8")
    for name, variant in models.items():
        version = root / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copy2(FIXED_LATENCY / "1" / "model.py", version / "model.py")
        config = _set(template, r'(\nname: ")[^"]*', name)
        config = _set(config, r"(\nmax_batch_size: )\d+", str(variant.max_batch_size))
        config = _set(
            config,
            r'(key: "execute_base_ms"\s*value: \{ string_value: ")[^"]*',
            f"{variant.base_ms:g}",
        )
        config = _set(
            config,
            r'(key: "execute_per_row_us"\s*value: \{ string_value: ")[^"]*',
            f"{variant.per_row_us:g}",
        )
        config = _set(config, r"(instance_group \[\s*\{\s*count: )\d+", str(variant.instances))
        (root / name / "config.pbtxt").write_text(config, encoding="utf-8")
    return root
