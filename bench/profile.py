"""Where the consumer's CPU goes, by stage: a ``py-spy record --format raw`` of the consumer
process, each sample attributed to the stage of its innermost frame that belongs to one.

Stages (matched on the frame's file path below the checkout, with or without the installed
package's ``rowbatch/`` prefix, innermost frame first; a frame of a library that serves several
stages, gRPC or numpy, only counts when nothing further out claims the sample):

- decode: ``wire/`` (the contract: chunks, headers, columns, codec_json, codec_arrow)
- intake: ``consumer/engine/intake_stage.py``, ``decode.py``, ``ledger.py``, ``budget.py``,
  ``batcher.py`` (a message's cost, its ledger entry, batching)
- check: ``consumer/model/binding.py``, ``chunk_check.py``, ``tensors.py`` (the binding's
  per-message check and the input tensors)
- inference: ``consumer/engine/inference_stage.py``, ``consumer/model/``, ``tritonclient``;
  ``grpc`` when nothing else claims it
- write: ``consumer/engine/write_stage.py``, ``results.py``, ``settle.py``,
  ``commit_stage.py``, ``consumer/sinks/``, ``psycopg``, ``sqlite3``, ``pyarrow/parquet``
  (result rows, the sink, settling)
- source: ``consumer/sources/`` (the source's own bookkeeping: records held, deliveries built,
  read-ahead, commits and acks)
- broker client: ``aiokafka``, ``google/cloud/pubsub``, ``google/api_core`` (fetching, protocol
  parsing)
- metrics: ``consumer/observe/``, ``prometheus_client``
- event loop: samples that end in ``asyncio``, ``selectors``, ``threading`` or
  ``concurrent.futures`` with no stage further out: polling, callbacks, thread hand-offs (py-spy
  in ``--nonblocking`` mode may count some waits in ``epoll`` here)
- other: the rest of ``consumer/engine/`` (the pipeline), logging, everything else
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STAGES = (
    "decode",
    "intake",
    "check",
    "inference",
    "write",
    "source",
    "broker client",
    "metrics",
    "event loop",
    "other",
)

_OWN: tuple[tuple[str, str], ...] = (
    ("consumer/sources/", "source"),
    ("consumer/sinks/", "write"),
    ("consumer/observe/", "metrics"),
    ("consumer/model/binding.py", "check"),
    ("consumer/model/chunk_check.py", "check"),
    ("consumer/model/tensors.py", "check"),
    ("consumer/model/", "inference"),
    ("consumer/engine/inference_stage.py", "inference"),
    ("consumer/engine/write_stage.py", "write"),
    ("consumer/engine/results.py", "write"),
    ("consumer/engine/settle.py", "write"),
    ("consumer/engine/commit_stage.py", "write"),
    ("consumer/engine/intake_stage.py", "intake"),
    ("consumer/engine/batcher.py", "intake"),
    ("consumer/engine/decode.py", "intake"),
    ("consumer/engine/ledger.py", "intake"),
    ("consumer/engine/budget.py", "intake"),
    ("wire/", "decode"),
)
_PACKAGE = "rowbatch/"
"""The installed package's directory in the checkout: the stages below name paths inside it."""
_LIBS: tuple[tuple[str, str], ...] = (
    ("/tritonclient/", "inference"),
    ("/psycopg/", "write"),
    ("/psycopg_binary/", "write"),
    ("/sqlite3/", "write"),
    ("/pyarrow/parquet/", "write"),
    ("/google/cloud/pubsub", "broker client"),
    ("/google/api_core/", "broker client"),
    ("/aiokafka/", "broker client"),
    ("/prometheus_client/", "metrics"),
)
_WEAK: tuple[tuple[str, str], ...] = (("/grpc/", "inference"),)
_LOOP = ("/asyncio/", "/selectors.py", "/threading.py", "/concurrent/futures/", "/queue.py")
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def stage_of_file(path: str, repo: str) -> tuple[str | None, bool]:
    """The stage a frame's file belongs to, and whether the match is weak."""
    if path.startswith(repo) and "/site-packages/" not in path:
        rel = path[len(repo) :].lstrip("/")
        rel = rel.removeprefix(_PACKAGE)
        for prefix, stage in _OWN:
            if rel.startswith(prefix):
                return stage, False
        return None, False
    for part, stage in _LIBS:
        if part in path:
            return stage, False
    for part, stage in _WEAK:
        if part in path:
            return stage, True
    return None, False


def stage_of_stack(frames: list[str], repo: str) -> str:
    """``frames`` outermost first, as py-spy writes them."""
    weak: str | None = None
    leaf = _FRAME.match(frames[-1]) if frames else None
    loop = leaf is not None and any(part in leaf.group(2) for part in _LOOP)
    for frame in reversed(frames):
        match = _FRAME.match(frame)
        path = match.group(2) if match else frame
        stage, is_weak = stage_of_file(path, repo)
        if stage is None:
            continue
        if not is_weak:
            return stage
        weak = weak or stage
    return weak or ("event loop" if loop else "other")


def breakdown(raw: str, repo: str) -> dict[str, int]:
    """Samples per stage from py-spy's raw (collapsed stack) output."""
    counts: Counter[str] = Counter(dict.fromkeys(STAGES, 0))
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack or not number.isdigit():
            continue
        counts[stage_of_stack(stack.split(";"), repo)] += int(number)
    return dict(counts)


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


@contextlib.contextmanager
def recording(pid: int, out: Path, rate_hz: int = 200) -> Iterator[list[str]]:
    """Record ``pid`` with py-spy while the block runs; ``errors`` (the yielded list) gets
    py-spy's complaint if it could not attach (it needs ptrace: root or CAP_SYS_PTRACE)."""
    errors: list[str] = []
    exe = py_spy()
    if exe is None:
        errors.append("py-spy is not installed (pip install -e '.[dev]')")
        yield errors
        return
    log = out.with_suffix(".log")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                exe,
                "record",
                "--format",
                "raw",
                "--full-filenames",
                "--nonblocking",
                "--subprocesses",
                "-r",
                str(rate_hz),
                "-o",
                str(out),
                "-p",
                str(pid),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            yield errors
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    if not out.exists() or out.stat().st_size == 0:
        errors.append(f"py-spy wrote no samples: {log.read_text(errors='replace')[-500:]}")


@dataclass(frozen=True)
class Profile:
    case: str
    samples: int
    share: dict[str, float]
    """Stage -> fraction of the consumer's on-CPU samples."""
    error: str | None = None
