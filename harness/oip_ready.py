"""The readiness check every model-server launcher waits on: a real KServe v2 gRPC client sees
the server ready and every named model ready (an error, e.g. NOT_FOUND for a model still
loading, counts as not ready)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


class ClientTls(Protocol):
    """What the check needs of a server's TLS set-up (``harness.triton.TritonTls``)."""

    @property
    def ca_cert(self) -> Path: ...
    @property
    def mutual(self) -> bool: ...
    @property
    def client_cert(self) -> Path | None: ...
    @property
    def client_key(self) -> Path | None: ...


class ReadyCheck:
    """``check()`` is True once the server at ``grpc_url`` and each of ``models`` is ready."""

    def __init__(self, grpc_url: str, models: Sequence[str], tls: ClientTls | None = None) -> None:
        self.grpc_url = grpc_url
        self.models = list(models)
        self.tls = tls

    def _client(self) -> grpcclient.InferenceServerClient:
        tls = self.tls
        if tls is None:
            return grpcclient.InferenceServerClient(self.grpc_url)
        return grpcclient.InferenceServerClient(
            self.grpc_url,
            ssl=True,
            root_certificates=str(tls.ca_cert),
            private_key=str(tls.client_key) if tls.mutual else None,
            certificate_chain=str(tls.client_cert) if tls.mutual else None,
        )

    def __call__(self) -> bool:
        client = self._client()
        try:
            return bool(client.is_server_ready(client_timeout=2.0)) and all(
                client.is_model_ready(m, client_timeout=2.0) for m in self.models
            )
        except InferenceServerException:
            return False
        finally:
            with contextlib.suppress(Exception):
                client.close()
