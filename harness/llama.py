"""Launcher for a real OpenAI-compatible LLM server: llama-cpp-python's
(``python -m llama_cpp.server``, 0.3.36, from the ``llama`` venv of :mod:`harness.server_venv`)
on CPU, serving a tiny llama model whose random weights the harness writes itself
(:mod:`harness.tiny_gguf`; nothing is downloaded). Temperature 0 makes its outputs repeatable.

One config file (``--config_file``) serves two aliases of the same GGUF: ``tiny`` (chat and
text completions, a small ``n_ctx`` so a long prompt overflows it) and ``tiny-embed``
(``embedding=True``, for ``/v1/embeddings``). The server listens on 127.0.0.1 on a free port,
in a session of its own (stopped by its pid's process group).

Optionally the server asks for an API key (``api_key``: every ``/v1`` endpoint then answers
401 ``{"detail": "Invalid API key"}`` to a request without ``Authorization: Bearer <key>``)
and serves HTTPS only (``tls``: uvicorn's ``ssl_certfile`` / ``ssl_keyfile``, top-level fields
of the config file like ``api_key``); the readiness check then sends the key and trusts
``tls.ca_cert``, and :attr:`LlamaEndpoint.url` is ``https://127.0.0.1:PORT``. Without them the
config file and URL are what they always were.

Behaviour of llama-cpp-python 0.3.36's server, as seen through HTTP here (what a client must
classify; tests/integration/test_llama_server.py checks each point):

- **One request at a time.** Every endpoint (even ``GET /v1/models``) takes one global lock, so
  requests are served strictly one after another and concurrent ones wait (no slots, no queue
  limit, never 429 or 503 for load): 4 chat calls of 200 tokens sent at once finished at about
  130, 210, 280 and 360 ms, one alone takes 50-100 ms. The ``openai-processing-ms`` response
  header counts the wait for the lock too.
- **One model loaded at a time.** The aliases share one slot: a request for an alias other than
  the loaded one closes that model and loads the other (10-25 ms for the tiny model, seconds for
  a real one), so alternating ``tiny`` and ``tiny-embed`` reloads on every switch.
- **Unknown model name: no error.** A ``model`` the config does not list is served by the
  *first* configured model (``tiny``), HTTP 200, same output as ``tiny``, and the response's
  ``model`` field echoes the unknown name. Without ``model`` the first model answers too, and
  ``model`` is its GGUF's path. ``/v1/embeddings`` for an unknown model therefore reaches
  ``tiny``, which has no embeddings: 500 (below). (The server's ``model_not_found`` 400 is only
  for a configured alias whose GGUF file is missing, per its source; not tried.)
- **Prompt too long for the context** (chat or text completion): HTTP 400, OpenAI-style body.
  ``/v1/chat/completions``::

      {"error": {"message": "This model's maximum context length is 256 tokens. However, you
       requested 1031 tokens (1023 in the messages, 8 in the completion). Please reduce the
       length of the messages or completion.", "type": "invalid_request_error",
       "param": "messages", "code": "context_length_exceeded"}}

  ``/v1/completions``: same status, type, param (``"messages"``, sic) and code; message
  "This model's maximum context length is 256 tokens, however you requested 1010 tokens (1002
  in your prompt; 8 for the completion). Please reduce your prompt; or completion length."
  The test is on the prompt alone: ``prompt_tokens >= n_ctx`` is refused; a prompt of
  ``n_ctx - 1`` tokens is served with 1 completion token. ``max_tokens`` beyond what is left
  is cut to it (``finish_reason: "length"``), never refused; without ``max_tokens`` the model
  generates up to ``n_ctx``.
- **Embeddings never overflow:** an input longer than the embedding model's batch (512 here)
  is silently truncated to it (``usage.prompt_tokens`` is 512). An empty input list: 500
  ``llama_decode returned -1``; an empty string: 200 with a vector.
- **``/v1/completions`` takes one prompt per request.** A list of one prompt is accepted; a list
  of several fails an ``assert`` in the server: HTTP 500, body ``{"error": {"message": "",
  "type": "internal_server_error", "param": null, "code": null}}``. ``n`` is ignored (one
  choice). So a client sends one request per row; each answer's choice has ``index`` 0.
- **Other failures are 500** ``{"error": {"message": <the exception's text>, "type":
  "internal_server_error", "param": null, "code": null}}``: ``/v1/embeddings`` on a model
  without ``embedding=True`` ("Llama model must be created with embedding=True to call this
  method"), and *request validation errors too* (not FastAPI's 422: e.g. ``messages`` not a
  list gives "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages'), ...").
  A chat request without ``messages`` is not an error: 200, generated from an empty
  conversation. A body that is not JSON: uvicorn's bare ``500 Internal Server Error``
  (text/plain), and the server closes that connection (a client reusing it may get a reset).
- Responses carry ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``).
  Tokens: BOS, one ``▁`` per space (and one leading), one token per other UTF-8 byte; the chat
  template adds ``<|user|>``...``<|assistant|>`` (a 5-character user message is 28 prompt
  tokens). At temperature 0 the output is printable ASCII gibberish, the same for the same
  input on every call and server start; it never ends with EOS (``finish_reason`` is
  ``"length"``).
- Timings on this machine (2 cores, 1 thread): a chat call with ``max_tokens`` 8 takes 3-14 ms
  (median ~7 ms) over HTTP, 64 tokens ~30 ms, 200 tokens 50-100 ms; the server is ready ~1.5 s
  after start once its venv is built.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from harness import tiny_gguf
from harness.errors import PrerequisiteMissing
from harness.proc import LOOPBACK, ProcessGroupService, ServiceProcess, free_port
from harness.server_venv import SERVER_VENVS, ServerVenv
from harness.service import ManagedService, RunDir, cache_dir

log = logging.getLogger(__name__)

#: The venv the server runs from (llama-cpp-python compiles llama.cpp: minutes, once per
#: machine; ``scripts/test.sh`` starts it in the background).
LLAMA_VENV: Final = SERVER_VENVS["llama"]
CHAT_MODEL: Final = "tiny"
EMBED_MODEL: Final = "tiny-embed"
DEFAULT_N_CTX: Final = 256
EMBED_N_CTX: Final = tiny_gguf.CONTEXT_LENGTH
READY_TIMEOUT_S: Final = 90.0
_HTTP_TIMEOUT_S: Final = 30.0
_TINY_SCRIPT: Final = Path(tiny_gguf.__file__).resolve()


@dataclass(frozen=True)
class LlamaTls:
    """HTTPS on the server: its certificate and key (PEM; uvicorn's ``ssl_certfile`` and
    ``ssl_keyfile``), and ``ca_cert``, the CA the readiness check trusts for that certificate
    (what a client's ``tls_ca_file`` names)."""

    server_cert: Path
    server_key: Path
    ca_cert: Path

    def context(self) -> ssl.SSLContext:
        """A client context trusting ``ca_cert`` alone (host names checked)."""
        return ssl.create_default_context(cafile=str(self.ca_cert))


@dataclass(frozen=True)
class LlamaEndpoint:
    """Where a running llama-cpp-python server listens, and what it serves."""

    url: str  # "http://127.0.0.1:PORT", "https://..." with tls (OpenAI clients want base_url)
    model_path: Path
    chat_model: str = CHAT_MODEL
    embed_model: str = EMBED_MODEL
    n_ctx: int = DEFAULT_N_CTX  # the chat model's context: longer prompts get a 400
    embedding_dim: int = tiny_gguf.N_EMBD
    api_key: str | None = field(default=None, repr=False)  # the key the server asks for
    tls: LlamaTls | None = None  # set when the server serves HTTPS only

    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer <key>`` when the server asks for a key, else nothing."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def base_url(self) -> str:
        """``<url>/v1``: what the OpenAI SDK's ``base_url`` wants."""
        return f"{self.url}/v1"


def tiny_model_path() -> Path:
    """Where the tiny model is cached: ``<cache>/llama/tiny-v<VERSION>.gguf``."""
    return cache_dir() / "llama" / f"tiny-v{tiny_gguf.VERSION}.gguf"


def tiny_model(venv: ServerVenv = LLAMA_VENV) -> Path:
    """The tiny GGUF model, written first (by :mod:`harness.tiny_gguf` run with the venv's
    interpreter, which has ``gguf``) when the cache lacks it. Makes the venv if needed."""
    path = tiny_model_path()
    if path.is_file():
        return path
    python = venv.bin("python")
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{path.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        done = subprocess.run(
            [str(python), str(_TINY_SCRIPT), str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0 or not path.is_file():
            raise PrerequisiteMissing(
                f"the tiny GGUF model ({_TINY_SCRIPT.name} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-2000:]})",
                f"a working {venv.name} venv with gguf (remove {venv.path()} to remake it)",
            )
    return path


def server_config(
    model: Path,
    port: int,
    *,
    n_ctx: int = DEFAULT_N_CTX,
    embed_n_ctx: int = EMBED_N_CTX,
    model_overrides: Mapping[str, Mapping[str, Any]] | None = None,
    api_key: str | None = None,
    tls: LlamaTls | None = None,
) -> dict[str, Any]:
    """The ``--config_file`` contents: the server on 127.0.0.1:``port`` with the two aliases.
    ``model_overrides`` maps an alias to ModelSettings fields merged into its entry;
    ``api_key`` and ``tls`` add the ServerSettings fields ``api_key``, ``ssl_certfile`` and
    ``ssl_keyfile`` (absent without them)."""
    common: dict[str, Any] = {
        "model": str(model),
        "seed": 1234,
        "n_threads": 1,  # a tiny model: threads cost more than they save on 2 cores
        "n_threads_batch": 1,
        "verbose": True,  # llama.cpp's load log and per-request timings go to the log
    }
    models: dict[str, dict[str, Any]] = {
        CHAT_MODEL: {**common, "model_alias": CHAT_MODEL, "n_ctx": n_ctx},
        EMBED_MODEL: {
            **common,
            "model_alias": EMBED_MODEL,
            "embedding": True,
            "n_ctx": embed_n_ctx,
            "n_batch": embed_n_ctx,
            "n_ubatch": embed_n_ctx,
        },
    }
    unknown = sorted(set(model_overrides or {}) - set(models))
    if unknown:
        raise ValueError(f"model_overrides name unknown aliases {unknown}; known: {list(models)}")
    for alias, fields in (model_overrides or {}).items():
        models[alias].update(fields)
    config: dict[str, Any] = {"host": LOOPBACK, "port": port}
    if api_key is not None:
        config["api_key"] = api_key
    if tls is not None:
        config["ssl_certfile"] = str(tls.server_cert)
        config["ssl_keyfile"] = str(tls.server_key)
    config["models"] = list(models.values())
    return config


def _http(
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    api_key: str | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """One request (GET, or POST of ``body`` as JSON), with ``api_key`` as a bearer token and
    ``context`` for https: its status and decoded JSON body."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - our URL
    try:
        with urllib.request.urlopen(  # noqa: S310
            request, timeout=_HTTP_TIMEOUT_S, context=context
        ) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _config_error(log_path: Path, offset: int) -> str:
    """What the server printed before its argparse usage text (which it prints after a config
    it cannot load, and which fills the log's tail), or ``""``."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    before, usage, _ = text.partition("\nusage: ")
    return before.strip()[-2000:] if usage else ""


@dataclass
class _ReadyCheck:
    """Ready when ``GET /v1/models`` lists both aliases and a one-token completion answers."""

    url: str
    api_key: str | None = None
    context: ssl.SSLContext | None = None
    last_error: str = ""

    def _http(self, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        return _http(f"{self.url}{path}", body, api_key=self.api_key, context=self.context)

    def __call__(self) -> bool:
        try:
            status, models = self._http("/v1/models")
            ids = {m.get("id") for m in models.get("data", [])} if status == 200 else set()
            if not {CHAT_MODEL, EMBED_MODEL} <= ids:
                self.last_error = f"GET /v1/models: {status} {models}"
                return False
            status, done = self._http(
                "/v1/completions",
                {"model": CHAT_MODEL, "prompt": "ready?", "max_tokens": 1, "temperature": 0},
            )
            if status != 200 or not done.get("choices"):
                self.last_error = f"POST /v1/completions: {status} {done}"
                return False
        except (OSError, ValueError, AttributeError) as exc:
            self.last_error = repr(exc)
            return False
        return True


class LlamaService(ProcessGroupService, ManagedService[LlamaEndpoint]):
    """``with LlamaService(run) as endpoint:`` runs the llama-cpp-python server until the block
    ends. ``n_ctx``: the chat model's context (tokens); ``model_overrides`` maps an alias
    (``tiny``, ``tiny-embed``) to llama_cpp.server ModelSettings fields merged into its entry;
    ``api_key``: the key every request must bear; ``tls``: serve HTTPS only. :meth:`stop`
    SIGTERMs its process group (uvicorn exits on it)."""

    name = "llama"

    def __init__(  # noqa: PLR0913 - keyword-only options, each with its default
        self,
        run: RunDir,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        model_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        api_key: str | None = None,
        tls: LlamaTls | None = None,
        name: str | None = None,
        port: int | None = None,
        venv: ServerVenv = LLAMA_VENV,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        if name is not None:
            self.name = name
        self.run = run
        self.n_ctx = n_ctx
        self.model_overrides = dict(model_overrides or {})
        self.api_key = api_key
        self.tls = tls
        self.port = port
        self.venv = venv
        self.ready_timeout_s = ready_timeout_s
        self._process: ServiceProcess | None = None

    def _env(self, venv_bin: Path) -> dict[str, str]:
        dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONFIG_FILE", "HOST", "PORT")
        env = {k: v for k, v in os.environ.items() if k not in dropped}
        env["PATH"] = os.pathsep.join([str(venv_bin), env.get("PATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> LlamaEndpoint:
        python = self.venv.bin("python")  # waits on a build in progress (its file lock)
        model = tiny_model(self.venv)
        self.port = self.port or free_port()
        config = server_config(
            model,
            self.port,
            n_ctx=self.n_ctx,
            model_overrides=self.model_overrides,
            api_key=self.api_key,
            tls=self.tls,
        )
        data = self.run.data(self.name)
        config_file = data / "config.json"
        config_file.write_text(json.dumps(config, indent=2))
        self._process = ServiceProcess(
            self.name,
            [str(python), "-m", "llama_cpp.server", "--config_file", str(config_file)],
            self.run.log(self.name),
            env=self._env(python.parent),
            cwd=data,
        )
        scheme = "http" if self.tls is None else "https"
        url = f"{scheme}://{LOOPBACK}:{self.port}"
        context = self.tls.context() if self.tls is not None else None
        check = _ReadyCheck(url, self.api_key, context)
        log_path = self.run.log(self.name)
        log_start = log_path.stat().st_size if log_path.exists() else 0
        started = time.monotonic()
        self._process.start()
        try:
            self._process.wait_ready(check, self.ready_timeout_s, 0.25)
        except Exception as exc:
            if check.last_error:
                exc.add_note(f"last readiness check: {check.last_error}")
            refused = _config_error(log_path, log_start)
            if refused:
                exc.add_note(f"the server refused its config {config_file}:\n{refused}")
            raise
        log.info("llama server ready in %.1f s on %s", time.monotonic() - started, url)
        return LlamaEndpoint(
            url=url, model_path=model, n_ctx=self.n_ctx, api_key=self.api_key, tls=self.tls
        )
