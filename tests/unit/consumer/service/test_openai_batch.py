"""``rowbatch-consumer openai-batch`` without a server: the input file's lines as requests (each
bad line named by its number, never dropped), the requests table and its manifest (the same
bytes for the same input, kept on a rerun, another input refused), the output file from the
state's answers and dead letters (one line per request line, in input order, stable ids), the
table run's configuration from a file's ``[model]``; and ``api = "batch"`` in the settings and
the handler (each row's body sent as it is to its url, the model name replaced, bad rows failing
alone)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.typing import NDArray
from pydantic import ValidationError

from rowbatch.consumer.model.answer import RowsFailed
from rowbatch.consumer.model.inference.errors import FatalInferenceError, PoisonInferenceError
from rowbatch.consumer.model.openai.client import EndpointPool
from rowbatch.consumer.model.openai.handler import OpenAIHandler
from rowbatch.consumer.model.openai.outputs import batch_outputs
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.openai.startup import _probe
from rowbatch.consumer.service import cli
from rowbatch.consumer.service.batch_requests import (
    DUPLICATE_ID,
    INVALID_JSON,
    INVALID_REQUEST,
    MANIFEST_FILE,
    REQUESTS_FILE,
    ROW_GROUP_ROWS,
    BadLine,
    BatchStateError,
    Request,
    convert,
    read_input,
)
from rowbatch.consumer.service.batch_results import write_output
from rowbatch.consumer.service.build_openai import template_columns
from rowbatch.consumer.service.config import ConfigError
from rowbatch.consumer.service.openai_batch import batch_config
from rowbatch.consumer.sinks.settings import ParquetSinkSettings
from rowbatch.consumer.sources.table.settings import TableSettings

Json = dict[str, Any]
CHAT = "/v1/chat/completions"


def line(custom_id: str, url: str = CHAT, body: Json | None = None, **more: Any) -> str:
    item = {"custom_id": custom_id, "method": "POST", "url": url, "body": body or {"n": 1}}
    return json.dumps({**item, **more})


def parsed(*lines: str) -> list[Request | BadLine]:
    return list(read_input(text.encode() + b"\n" for text in lines))


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith(("ROWBATCH_", "JOB_COMPLETION"))]:
        monkeypatch.delenv(name)


# --- the input --------------------------------------------------------------------------------


def test_request_lines_keep_their_numbers_and_a_compact_body() -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hé"}]}
    got = parsed(line("a", body=body), "   ", line("b", url="/v1/embeddings"))
    assert got == [
        Request(1, "a", CHAT, json.dumps(body, separators=(",", ":"), ensure_ascii=False)),
        Request(3, "b", "/v1/embeddings", '{"n":1}'),
    ]


def test_a_byte_order_mark_and_crlf_line_ends_are_read() -> None:
    raw = [b"\xef\xbb\xbf" + line("a").encode() + b"\r\n", line("b").encode() + b"\r\n"]
    assert [r.custom_id for r in read_input(raw) if isinstance(r, Request)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "code", "custom_id", "words"),
    [
        ('{"custom_id": "x", ', INVALID_JSON, None, "line 2: not JSON"),
        ("[1, 2]", INVALID_JSON, None, "line 2: a JSON list, not an object"),
        (line(""), INVALID_REQUEST, "", "line 2: custom_id is '', not a non-empty string"),
        ('{"url": "/v1/completions", "body": {}}', INVALID_REQUEST, None, "custom_id is None"),
        (line("x", method="GET"), INVALID_REQUEST, "x", "method is 'GET'"),
        (line("x", url="/v1/responses"), INVALID_REQUEST, "x", "url '/v1/responses' is not"),
        (json.dumps({"custom_id": "x", "url": CHAT, "body": "hi"}), INVALID_REQUEST, "x", "str"),
        (line("a"), DUPLICATE_ID, "a", "custom_id 'a' is also on line 1"),
    ],
)
def test_a_bad_line_is_named_by_its_number_and_kept(
    text: str, code: str, custom_id: str | None, words: str
) -> None:
    first, bad, last = parsed(line("a"), text, line("z"))
    assert isinstance(first, Request) and isinstance(last, Request)
    assert isinstance(bad, BadLine)
    assert (bad.line, bad.code, bad.custom_id) == (2, code, custom_id)
    assert bad.message.startswith("line 2: ") and words in bad.message, bad.message


# --- the requests table -----------------------------------------------------------------------


def batch_file(tmp_path: Path, lines: list[str], name: str = "batch.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(text + "\n" for text in lines))
    return path


def test_the_requests_table_holds_the_requests_in_row_groups(tmp_path: Path) -> None:
    lines = [line(f"r{i}", body={"i": i}) for i in range(2 * ROW_GROUP_ROWS + 5)]
    lines.insert(7, "not json")
    converted = convert(batch_file(tmp_path, lines), tmp_path / "state")
    assert (converted.lines, converted.requests) == (len(lines), len(lines) - 1)
    assert [(b.line, b.code) for b in converted.bad] == [(8, INVALID_JSON)]
    requests = pq.ParquetFile(tmp_path / "state" / REQUESTS_FILE)
    assert requests.metadata.num_row_groups == 3
    table = requests.read()
    assert table.column_names == ["line", "custom_id", "url", "body"]
    assert table["line"].to_pylist()[6:9] == [7, 9, 10]
    assert table["custom_id"].to_pylist()[7] == "r7"
    assert json.loads(table["body"].to_pylist()[7]) == {"i": 7}


def test_the_same_input_makes_the_same_bytes_and_a_rerun_keeps_them(tmp_path: Path) -> None:
    source = batch_file(tmp_path, [line("a"), "oops", line("b")])
    first = convert(source, tmp_path / "one")
    assert convert(source, tmp_path / "two") == first
    for name in (REQUESTS_FILE, MANIFEST_FILE):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    stamp = (tmp_path / "one" / REQUESTS_FILE).stat().st_mtime_ns
    assert convert(source, tmp_path / "one") == first
    assert (tmp_path / "one" / REQUESTS_FILE).stat().st_mtime_ns == stamp


def test_a_state_of_another_input_is_refused(tmp_path: Path) -> None:
    convert(batch_file(tmp_path, [line("a")]), tmp_path / "state")
    other = batch_file(tmp_path, [line("b")], "other.jsonl")
    with pytest.raises(BatchStateError, match="holds the requests of another input"):
        convert(other, tmp_path / "state")


# --- the output -------------------------------------------------------------------------------


def answer(n: int) -> str:
    return json.dumps({"object": "chat.completion", "choices": [{"message": {"content": f"{n}"}}]})


def results(state: Path, shard: int, shards: int, rows: dict[int, str]) -> None:
    """Answers as the Parquet sink leaves them (a hive partition, hidden files beside)."""
    root = state / "results" / f"shard-{shard}-of-{shards}"
    (root / "processed_date=2026-12-07").mkdir(parents=True)
    (root / "_rowbatch").mkdir()
    (root / "_rowbatch" / "keys.sqlite").write_bytes(b"not parquet")
    table = pa.table(
        {
            "line": pa.array(list(rows), pa.int64()),
            "custom_id": [f"c{n}" for n in rows],
            "response": list(rows.values()),
        }
    )
    pq.write_table(table, root / "processed_date=2026-12-07" / "part-1.parquet")


def dead_letter(state: Path, shard: int, shards: int, file_row: int, code: str) -> None:
    folder = state / "table" / f"shard-{shard}-of-{shards}"
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "chunk_id": f"requests.parquet@{file_row}",
        "row_index": 0,
        "file": "requests.parquet",
        "file_row": file_row,
        "reason": "rejected-by-model",
        "code": code,
        "message": f"refused row {file_row}",
        "row": {},
    }
    (folder / f"dead-letters-{file_row}.jsonl").write_text(json.dumps(record) + "\n")


def test_the_output_has_a_line_per_request_line_in_input_order(tmp_path: Path) -> None:
    # lines 1-6: c1, bad, c3 (dead-lettered), c4, c5, c6; two shards' answers.
    lines = [line("c1"), "{nope", line("c3"), line("c4"), line("c5"), line("c6")]
    state = tmp_path / "state"
    converted = convert(batch_file(tmp_path, lines), state)
    output = tmp_path / "out.jsonl"
    results(state, 0, 2, {1: answer(1), 5: answer(5)})
    assert write_output(state, 2, converted, output) == [3, 4, 6]
    assert not output.exists()
    results(state, 1, 2, {6: answer(6), 4: answer(4)})
    dead_letter(state, 1, 2, 1, "prompt_too_long")  # file row 1 is line 3
    counts: Counter[str] = Counter()
    assert write_output(state, 2, converted, output, counts) == []
    assert counts == {"answered": 4, "prompt_too_long": 1, INVALID_JSON: 1}
    got = [json.loads(text) for text in output.read_text().splitlines()]
    assert [g["custom_id"] for g in got] == ["c1", None, "c3", "c4", "c5", "c6"]
    answered = {g["custom_id"]: g for g in got if g["response"] is not None}
    assert sorted(answered) == ["c1", "c4", "c5", "c6"]
    for custom_id, g in answered.items():
        assert g["error"] is None
        assert g["response"]["status_code"] == 200
        assert g["response"]["request_id"].startswith("req_")
        assert g["response"]["body"] == json.loads(answer(int(custom_id[1:])))
    assert got[1]["error"]["code"] == INVALID_JSON
    assert got[1]["error"]["message"].startswith("line 2: not JSON")
    assert got[2]["error"] == {"code": "prompt_too_long", "message": "refused row 1"}
    assert got[2]["response"] is None
    ids = [g["id"] for g in got]
    assert len(set(ids)) == len(ids) and all(i.startswith("batch_req_") for i in ids)
    first = output.read_bytes()
    assert write_output(state, 2, converted, output) == []
    assert output.read_bytes() == first


def test_an_input_with_no_request_gets_its_error_lines(tmp_path: Path) -> None:
    state = tmp_path / "state"
    converted = convert(batch_file(tmp_path, ["x", "", "[]"]), state)
    output = tmp_path / "out.jsonl"
    assert converted.requests == 0 and converted.lines == 2
    assert write_output(state, 1, converted, output) == []
    got = [json.loads(text) for text in output.read_text().splitlines()]
    assert [g["error"]["message"][:7] for g in got] == ["line 1:", "line 3:"]


# --- the configuration ------------------------------------------------------------------------


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(text)
    return path


MODEL = '[model]\nkind = "openai"\nurl = "http://vllm:8000"\nname = "Qwen/Qwen2.5-0.5B"\n'


def test_the_table_run_takes_the_files_model_as_api_batch(tmp_path: Path) -> None:
    text = (
        MODEL
        + 'prompt = "Summarise {body}"\ntemperature = 0.7\napi = "chat"\nmax_in_flight = 64\n'
        + '[source]\nkind = "kafka"\n[sink]\nkind = "sqlite"\n'
    )
    state = tmp_path / "state"
    config, ignored = batch_config(
        config_file(tmp_path, text), requests=state / REQUESTS_FILE, state=state, shard=1, shards=3
    )
    assert ignored == ["model.prompt", "model.temperature", "source", "sink"]
    model = config.model
    assert isinstance(model, OpenAISettings)
    assert (model.api, model.prompt, model.max_in_flight) == ("batch", None, 64)
    assert template_columns(model) == ("custom_id", "url", "body")
    source = config.source
    assert isinstance(source, TableSettings)
    assert (source.shard, source.shards, source.chunk_rows) == (1, 3, 1)
    assert source.input == str((state / REQUESTS_FILE).resolve())
    assert isinstance(config.sink, ParquetSinkSettings)
    assert config.sink.url == str((state / "results" / "shard-1-of-3").resolve())
    assert config.binding.passthrough == {"line": "int64", "custom_id": "string"}
    assert "response" in config.binding.outputs
    assert config.server.port == 0 and config.log_format == "text"


def test_the_environment_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROWBATCH_MODEL__API_KEY", "sk-from-env")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    state = tmp_path / "state"
    config, _ = batch_config(
        config_file(tmp_path, MODEL), requests=state / "r", state=state, shard=None, shards=4
    )
    assert isinstance(config.model, OpenAISettings)
    assert config.model.key() == "sk-from-env"
    assert isinstance(config.source, TableSettings) and config.source.shard == 2
    assert isinstance(config.sink, ParquetSinkSettings)
    assert config.sink.url.endswith("shard-2-of-4")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[model]\nname = "m"\n', 'kind = "openai"'),
        ("[model\n", "cannot read config"),
        (MODEL + "max_in_flight = 0\n", "model.max_in_flight"),
    ],
)
def test_a_bad_config_is_refused(tmp_path: Path, text: str, words: str) -> None:
    state = tmp_path / "state"
    with pytest.raises(ConfigError, match=words):
        batch_config(config_file(tmp_path, text), requests=state, state=state, shard=0, shards=1)


def test_the_command_is_dispatched_with_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["openai-batch", "--help"])
    assert exited.value.code == 0
    assert "--input FILE" in capsys.readouterr().out
    assert "openai-batch" in cli.EPILOG


def test_a_bad_config_exits_2_before_converting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = batch_file(tmp_path, [line("a")])
    config = config_file(tmp_path, '[model]\nkind = "oip"\n')
    output = tmp_path / "out.jsonl"
    argv = ["openai-batch", "--config", str(config), "--input", str(source)]
    assert cli.main([*argv, "--output", str(output)]) == 2
    assert 'kind = "openai"' in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl.state").exists()


# --- api = "batch": settings, start-up, handler ------------------------------------------------


def batch_settings(**fields: Any) -> OpenAISettings:
    return OpenAISettings(**({"kind": "openai", "name": "fleet-model", "api": "batch"} | fields))


def test_batch_needs_no_prompt_and_the_others_still_do() -> None:
    assert batch_settings().prompt is None and batch_settings().requests_rows == 1
    with pytest.raises(ValidationError, match="Field required"):
        OpenAISettings(kind="openai", name="m", api="chat")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"prompt": "{body}"}, "model.prompt: not with api = 'batch'"),
        ({"system_prompt": "be brief"}, "model.system_prompt"),
        ({"json_schema": {"properties": {"a": {"type": "string"}}}}, "model.json_schema"),
        ({"sampling": {"top_p": 0.9}}, "model.sampling"),
        ({"temperature": 0.5}, "model.temperature"),
        ({"rows_per_request": 4}, "a batch request holds one row"),
    ],
)
def test_batch_refuses_what_shapes_a_request(fields: Json, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        batch_settings(**fields)


def test_batch_start_up_sends_no_probe() -> None:
    nothing = cast(EndpointPool, object())  # any request would fail on it
    assert asyncio.run(_probe(nothing, batch_settings())) == 0


@dataclass
class Rows:
    columns: dict[str, NDArray[Any]]
    nulls: dict[str, NDArray[np.bool_]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["url"])


def rows(*items: tuple[str, str]) -> Rows:
    return Rows(
        {
            "custom_id": np.array([f"c{i}" for i in range(len(items))], dtype=object),
            "url": np.array([u for u, _ in items], dtype=object),
            "body": np.array([b for _, b in items], dtype=object),
        }
    )


TOO_LONG = "This model's maximum context length is 256 tokens. However, you requested 900 tokens"


def handler(answer: Callable[[str, Json], Json], sent: list[tuple[str, Json]]) -> OpenAIHandler:
    async def post(path: str, body: Json) -> Json:
        sent.append((path, body))
        return answer(path, body)

    return OpenAIHandler(
        post, batch_settings(), batch_outputs(), {}, target_batch_size=8, clock=lambda: 1.0
    )


def serve(path: str, body: Json) -> Json:
    if path == "/v1/embeddings":
        return {"object": "list", "data": [{"embedding": [0.5, 1.5]}], "model": body["model"]}
    if "too long" in json.dumps(body):
        raise PoisonInferenceError(f"HTTP 400: {TOO_LONG}", model="m", status="400")
    if body.get("messages") == "boom":
        raise FatalInferenceError("HTTP 500: 1 validation error", model="m", status="500")
    text = {"text": "hi"} if path == "/v1/completions" else {"message": {"content": "hi"}}
    return {
        "choices": [{"index": 0, "finish_reason": "length", **text}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
        "model": body["model"],
    }


def test_each_row_is_its_request_with_our_model_name() -> None:
    sent: list[tuple[str, Json]] = []
    batch = rows(
        (CHAT, json.dumps({"model": "gpt-4o", "messages": [], "max_tokens": 3})),
        ("/v1/completions", json.dumps({"model": "gpt-3.5-turbo-instruct", "prompt": "x"})),
        ("/v1/embeddings", json.dumps({"model": "text-embedding-3-small", "input": "x"})),
    )
    got = asyncio.run(handler(serve, sent).run(batch))
    assert sorted(sent, key=lambda s: s[0]) == [
        (CHAT, {"model": "fleet-model", "messages": [], "max_tokens": 3}),
        ("/v1/completions", {"model": "fleet-model", "prompt": "x"}),
        ("/v1/embeddings", {"model": "fleet-model", "input": "x"}),
    ]
    columns = got.outputs
    responses = [json.loads(text) for text in columns["response"]]
    assert responses[0]["choices"][0]["message"]["content"] == "hi"
    assert responses[2]["data"][0]["embedding"] == [0.5, 1.5]
    assert columns["text"].tolist() == ["hi", "hi", ""]
    assert columns["finish_reason"].tolist() == ["length", "length", ""]
    assert columns["completion_tokens"].tolist() == [2, 2, 0]


def test_a_bad_row_fails_alone_and_its_siblings_are_answered() -> None:
    sent: list[tuple[str, Json]] = []
    batch = rows(
        (CHAT, json.dumps({"messages": []})),
        ("/v1/responses", json.dumps({"input": "x"})),
        (CHAT, "[1, 2]"),
        (CHAT, "{not json"),
        (CHAT, json.dumps({"messages": [], "stream": True})),
        (CHAT, json.dumps({"messages": [{"role": "user", "content": "too long"}]})),
        (CHAT, json.dumps({"messages": "boom"})),
    )
    with pytest.raises(RowsFailed) as caught:
        asyncio.run(handler(serve, sent).run(batch))
    failed = caught.value.failed
    assert {row: error.code for row, error in failed.items()} == {
        1: "invalid_request",
        2: "invalid_request",
        3: "invalid_request",
        4: "invalid_request",
        5: "prompt_too_long",
        6: "server_error",  # dead-lettered, not nacked: every request gets an outcome
    }
    assert not any(error.fatal for error in failed.values())
    assert "'/v1/responses' is not one of" in failed[1].message
    assert "list, not an object" in failed[2].message
    assert "stream" in failed[4].message
    assert len(sent) == 3  # the first row's and the two the server refused
    assert json.loads(caught.value.answer.outputs["response"][0])["model"] == "fleet-model"
