"""README.md's Quickstart, run as written against the real Kafka broker and Triton: its TOML
block saved as ``quickstart.toml`` and its bash commands run (through ``bash -c``) in a fresh
directory: ``admin ensure``, ``check``, ``run`` in the background, the ``printf`` and
``rowbatch-producer publish`` of a first chunk, and the ``sqlite3`` query of the results.

Only what must differ on a test machine is substituted: the broker's and the model server's
addresses, the topic and group (unique per run), the model name (the harness's ``embedder``:
TEXT in, EMBEDDING out, as the README's ``my_model``) and ``.venv/bin/`` (this venv's, the
commands run outside the checkout). The consumer's metrics port (default 9464) comes from
``ROWBATCH_SERVER__PORT``, a free port, so that two runs on one machine never collide.
Every substitution must match exactly once: a reworded quickstart fails here, by name.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.kafka import KafkaEndpoint
from harness.proc import free_port, log_tail
from harness.service import REPO_ROOT
from harness.triton import TritonEndpoint

pytestmark = pytest.mark.timeout(600)  # the first use starts Kafka and Triton

README = REPO_ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
ROWS_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
COMMAND_TIMEOUT_S = 120.0

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Quickstart:
    toml: str
    consumer: list[str]
    """``admin ensure``, ``check``, ``run``, one command each (comments dropped)."""
    publish: list[str]
    """The ``printf``, the ``rowbatch-producer publish`` and the ``sqlite3`` query."""


def _section(text: str, heading: str) -> str:
    text = "\n" + text
    start = text.find(f"\n{heading}\n")
    assert start >= 0, f"README.md has no {heading!r} section"
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _commands(block: str) -> list[str]:
    """One string per command: continuation lines joined, trailing ``# comments`` dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(re.sub(r"\s+#[^'\"]*$", "", line).strip())
    return out


def parse_quickstart(readme: str) -> Quickstart:
    """The Quickstart's fenced blocks: one ``toml`` (the config), then ``bash`` blocks, one
    with the three ``rowbatch-consumer`` commands and one with printf/publish/sqlite3."""
    section = _section(readme, "## Quickstart")
    blocks = _FENCE.findall(section)
    tomls = [body for lang, body in blocks if lang == "toml"]
    assert len(tomls) == 1, f"the Quickstart should have one toml block, found {len(tomls)}"
    bash = [_commands(body) for lang, body in blocks if lang == "bash"]
    consumer = [b for b in bash if any("rowbatch-consumer run" in c for c in b)]
    publish = [b for b in bash if any("rowbatch-producer publish" in c for c in b)]
    assert len(consumer) == 1 and len(publish) == 1, (
        "the Quickstart should have one bash block with `rowbatch-consumer run` and one with "
        f"`rowbatch-producer publish`; its bash blocks are {bash}"
    )
    verbs = [shlex.split(c)[1:2] + shlex.split(c)[2:3] for c in consumer[0]]
    assert verbs == [["admin", "ensure"], ["check", "--config"], ["run", "--config"]], (
        f"the Quickstart's consumer commands changed shape: {consumer[0]}"
    )
    programs = [shlex.split(c)[0] for c in publish[0]]
    assert programs == ["printf", ".venv/bin/rowbatch-producer", "sqlite3"], (
        f"the Quickstart's publish block changed shape: {publish[0]}"
    )
    return Quickstart(tomls[0], consumer[0], publish[0])


def substitute(text: str, replacements: list[tuple[str, str]], where: str) -> str:
    """Each ``old`` (a literal) replaced by ``new``; each must occur exactly once."""
    for old, new in replacements:
        count = text.count(old)
        assert count == 1, f"expected {old!r} once in the Quickstart's {where}, found {count}"
        text = text.replace(old, new)
    return text


def _env(metrics_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    env["ROWBATCH_SERVER__PORT"] = str(metrics_port)
    return env


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


def _assert_ok(done: subprocess.CompletedProcess[str], command: str) -> None:
    assert done.returncode == 0, (
        f"`{command}` exited {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )


def _row_count(path: Path, table: str) -> int:
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    except sqlite3.OperationalError:  # no table yet, or locked
        return 0
    return int(row[0]) if row else 0


def _query(command: str, cwd: Path, env: dict[str, str]) -> list[list[str]]:
    """The README's ``sqlite3 FILE 'SELECT ...'``: the CLI when installed, else the same SQL
    through Python's sqlite3. Rows as lists of strings (the CLI's ``a|b|c`` lines)."""
    if shutil.which("sqlite3"):
        done = _run(command, cwd, env)
        _assert_ok(done, command)
        return [line.split("|") for line in done.stdout.splitlines() if line]
    _, database, sql = shlex.split(command)
    with sqlite3.connect(cwd / database) as conn:
        return [[str(v) for v in row] for row in conn.execute(sql)]


def test_parse_quickstart_names_a_changed_shape() -> None:
    with pytest.raises(AssertionError, match="no '## Quickstart' section"):
        parse_quickstart("# rowbatch\n\n## Install\n")
    with pytest.raises(AssertionError, match="one toml block"):
        parse_quickstart("## Quickstart\n\n```bash\nls\n```\n")


def test_the_readme_quickstart_runs(
    kafka: KafkaEndpoint, triton: TritonEndpoint, tmp_path: Path
) -> None:
    quick = parse_quickstart(README.read_text())
    unique = uuid.uuid4().hex[:10]
    topic, group = f"rows-{unique}", f"rowbatch-quickstart-{unique}"
    config = substitute(
        quick.toml,
        [
            ('"localhost:9092"', f'"{kafka.bootstrap_servers}"'),
            ('topic = "rows"', f'topic = "{topic}"'),
            ('group_id = "rowbatch-quickstart"', f'group_id = "{group}"'),
            ('"localhost:8001"', f'"{triton.grpc_url}"'),
            ('name = "my_model"', 'name = "embedder"'),
        ],
        "toml block",
    )
    parsed = tomllib.loads(config)
    assert parsed["source"]["topic"] == topic and parsed["model"]["name"] == "embedder"
    (tmp_path / "quickstart.toml").write_text(config)
    table, database = parsed["sink"]["table"], tmp_path / parsed["sink"]["path"]

    venv = [(".venv/bin/", f"{VENV_BIN}/")]
    ensure, check, run = (substitute(c, venv, "consumer commands") for c in quick.consumer)
    printf, publish, select = quick.publish
    publish = substitute(
        publish,
        [
            *venv,
            ("--bootstrap localhost:9092", f"--bootstrap {kafka.bootstrap_servers}"),
            ("--topic rows ", f"--topic {topic} "),
        ],
        "publish command",
    )
    env = _env(free_port())

    started = time.monotonic()
    for command in (ensure, check):
        _assert_ok(_run(command, tmp_path, env), command)

    log_path = tmp_path / "consumer.log"
    with log_path.open("wb") as log:
        consumer = subprocess.Popen(
            ["bash", "-c", f"exec {run}"],  # exec: the pid is the consumer's
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        for command in (printf, publish):
            _assert_ok(_run(command, tmp_path, env), command)

        deadline = time.monotonic() + ROWS_TIMEOUT_S
        while _row_count(database, table) < 2:
            code = consumer.poll()
            assert code is None, f"the consumer exited {code}; log:\n{log_tail(log_path)}"
            assert time.monotonic() < deadline, (
                f"no 2 rows in {database} after {ROWS_TIMEOUT_S:.0f} s; log:\n{log_tail(log_path)}"
            )
            time.sleep(0.2)

        rows = _query(select, tmp_path, env)
        assert sorted((r[0], r[3]) for r in rows) == [("1", "embedder"), ("2", "embedder")], rows
        assert len({r[1] for r in rows}) == 1, rows  # one chunk
        assert sorted(r[2] for r in rows) == ["0", "1"], rows

        os.kill(consumer.pid, signal.SIGTERM)
        stopping = time.monotonic()
        code = consumer.wait(STOP_TIMEOUT_S)
        assert code == 0, f"the consumer exited {code} on SIGTERM; log:\n{log_tail(log_path)}"
        print(
            f"\nquickstart: rows in {stopping - started:.1f} s, "
            f"SIGTERM exit in {time.monotonic() - stopping:.1f} s"
        )
    finally:
        if consumer.poll() is None:
            os.kill(consumer.pid, signal.SIGKILL)
            consumer.wait(30)
