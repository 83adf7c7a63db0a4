"""``rowbatch-consumer openai-batch`` end to end against a real OpenAI-compatible server
(llama-cpp-python on a tiny local model, harness/llama.py): an OpenAI Batch API input file of
chat and completions requests, one prompt over the server's context, one body the server
answers with a 500 and one line that is not JSON becomes OpenAI's batch output file, one line
per input line in input order; a rerun on the same state sends no request and writes the same
bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.llama import LlamaEndpoint
from harness.service import RunDir

CHATS = 20
COMPLETIONS = 5
MAX_TOKENS = 6
LONG = "very long " * 200  # ~2,000 tokens, over the server's n_ctx of 256
MALFORMED = '{"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions", "body": {'


def chat_body(i: int) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",  # OpenAI's name: replaced by [model] name
        "messages": [{"role": "user", "content": f"Say something about batch row {i}."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }


def request(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def batch_lines() -> list[tuple[str | None, str]]:
    """(custom_id, line) of the input, chat and completions interleaved."""
    lines: list[tuple[str | None, str]] = []
    for i in range(CHATS):
        lines.append((f"chat-{i}", request(f"chat-{i}", "/v1/chat/completions", chat_body(i))))
        if i % 4 == 1:
            n = i // 4
            body = {"model": "gpt-3.5-turbo-instruct", "prompt": f"Once upon {n}", "max_tokens": 6}
            lines.append((f"completion-{n}", request(f"completion-{n}", "/v1/completions", body)))
        if i == 9:
            lines.append((None, MALFORMED))
        if i == 14:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": LONG}]}
            lines.append(("too-long", request("too-long", "/v1/chat/completions", body)))
        if i == 17:  # llama.cpp's server answers a malformed body with a 500, every time
            body = {"model": "gpt-4o-mini", "messages": "not a list"}
            lines.append(("server-500", request("server-500", "/v1/chat/completions", body)))
    return lines


def server_posts(run_dir: RunDir) -> int:
    """Requests the llama server answered so far (its access log's POST lines)."""
    log = run_dir.log("llama")
    return sum(1 for line in log.read_text(errors="replace").splitlines() if '"POST /v1/' in line)


def run_batch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rowbatch.consumer", "openai-batch", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path
    )


@pytest.mark.timeout(900)  # the first test may wait for the llama venv build
def test_a_batch_file_becomes_the_batch_output_file_and_a_rerun_sends_nothing(
    llama: LlamaEndpoint, run_dir: RunDir, tmp_path: Path
) -> None:
    lines = batch_lines()
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(line + "\n" for _, line in lines))
    config = tmp_path / "server.toml"
    config.write_text(
        "[model]\n"
        'kind = "openai"\n'
        f'url = "{llama.url}"\n'
        f'name = "{llama.chat_model}"\n'
        "max_in_flight = 4\n"
        "startup_wait_s = 60\n"
        "max_wait_ms = 50\n"
    )
    output = tmp_path / "results.jsonl"
    args = ("--config", str(config), "--input", str(source), "--output", str(output))
    before = server_posts(run_dir)
    done = run_batch(tmp_path, *args, "--summary", str(tmp_path / "first.json"))
    assert done.returncode == 0, done.stderr[-4000:]
    requests = len(lines) - 1  # the malformed line is never sent
    sent = server_posts(run_dir) - before
    assert sent == requests, f"{sent} POSTs for {requests} requests"

    got = [json.loads(line) for line in output.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == [c for c, _ in lines]
    assert len({g["id"] for g in got}) == len(got)
    assert all(g["id"].startswith("batch_req_") for g in got)
    by_id = {g["custom_id"]: g for g in got}
    for custom_id, _ in lines:
        if custom_id in (None, "too-long", "server-500"):
            continue
        entry = by_id[custom_id]
        assert entry["error"] is None
        response = entry["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["choices"], entry
        assert body["usage"]["completion_tokens"] <= MAX_TOKENS
        if custom_id.startswith("chat-"):
            assert body["object"] == "chat.completion"
            assert isinstance(body["choices"][0]["message"]["content"], str)
        else:
            assert body["object"] == "text_completion"
            assert isinstance(body["choices"][0]["text"], str)

    long = by_id["too-long"]
    assert long["response"] is None
    assert long["error"]["code"] == "prompt_too_long"
    assert "context" in long["error"]["message"]
    refused = by_id["server-500"]
    assert refused["response"] is None
    assert refused["error"]["code"] == "server_error"
    assert "HTTP 500" in refused["error"]["message"]
    [broken] = [g for g in got if g["custom_id"] is None]
    malformed_line = next(n for n, (c, _) in enumerate(lines, 1) if c is None)
    assert broken["response"] is None
    assert broken["error"]["code"] == "invalid_json_line"
    assert broken["error"]["message"].startswith(f"line {malformed_line}: not JSON")
    assert f"line {malformed_line}" in done.stderr

    # The answer is the server's own (temperature 0): the same as asking it directly, with
    # the file's model name replaced by [model] name.
    direct = httpx.post(
        f"{llama.url}/v1/chat/completions",
        json={**chat_body(3), "model": llama.chat_model},
        timeout=60,
    ).json()
    assert (
        by_id["chat-3"]["response"]["body"]["choices"][0]["message"]["content"]
        == direct["choices"][0]["message"]["content"]
    )

    first = output.read_bytes()
    before = server_posts(run_dir)
    again = run_batch(tmp_path, *args, "--summary", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr[-4000:]
    assert server_posts(run_dir) == before, "the rerun sent requests"
    summary = json.loads((tmp_path / "again.json").read_text())
    assert summary["read_rows"] == 0 and summary["skipped_rows"] == requests
    assert output.read_bytes() == first
