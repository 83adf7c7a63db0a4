"""The ``scorer`` model on KServe's Python model server (``kserve`` 0.21), speaking the Open
Inference Protocol (v2) over gRPC and REST: the same formula, datatypes and shapes as the Triton
model in ``deploy/models/scorer`` (``harness.reference_models.score``):

    FEATURES FP32 [-1, 16], COUNT INT64 [-1, 1] -> SCORE FP32 [-1, 1], LABEL INT32 [-1, 1]
    SCORE = tanh(mean(FEATURES)) + 0.01 * log1p(max(COUNT, 0)); LABEL = SCORE > 0

ModelMetadata declares those inputs and outputs (the leading -1 is the batch axis), unless
``--declare_tensors false``: then, like a ``kserve.Model`` that does not override
``get_input_types`` / ``get_output_types``, it lists none. KServe's ModelMetadata has no
versions list; every response carries ``--model_version``.

Two COUNT values are error sentinels, for tests of how KServe maps model errors to gRPC
statuses: :data:`INVALID_COUNT` raises ``kserve.errors.InvalidInput`` (INVALID_ARGUMENT, with
the message) and :data:`CRASH_COUNT` raises a plain ``RuntimeError`` (INTERNAL, "Internal
server error"). Every other COUNT, negative ones included, is scored as Triton scores it.

Run with the ``kserve`` venv's Python (``harness/kserve.py`` does)::

    python scorer.py --grpc_port 8081 --http_port 8080 [--bind_address 127.0.0.1]

KServe 0.21 has no bind-address argument: its REST server (uvicorn) binds 0.0.0.0 and its gRPC
server ``[::]``. ``--bind_address`` (default 127.0.0.1) rebinds both (see :func:`bind_to`).
"""

from __future__ import annotations

import argparse
from typing import Any

import grpc
import kserve
import numpy as np
from kserve import model_server
from kserve.errors import InvalidInput
from kserve.logging import logger as log
from kserve.protocol.grpc import server as grpc_server
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

FEATURE_DIM = 16
INVALID_COUNT = -7777
"""A row with this COUNT is rejected with ``InvalidInput`` (gRPC INVALID_ARGUMENT)."""
CRASH_COUNT = -9999
"""A row with this COUNT makes the model raise ``RuntimeError`` (gRPC INTERNAL)."""

INPUTS = (
    {"name": "FEATURES", "datatype": "FP32", "shape": [-1, FEATURE_DIM]},
    {"name": "COUNT", "datatype": "INT64", "shape": [-1, 1]},
)
OUTPUTS = (
    {"name": "SCORE", "datatype": "FP32", "shape": [-1, 1]},
    {"name": "LABEL", "datatype": "INT32", "shape": [-1, 1]},
)


def score(features: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SCORE and LABEL for one request's rows (copy of ``harness.reference_models.score``)."""
    mean = features.astype(np.float64).mean(axis=1, keepdims=True)
    counts = np.maximum(count.astype(np.float64), 0.0)
    scores = (np.tanh(mean) + 0.01 * np.log1p(counts)).astype(np.float32)
    labels = (scores > 0).astype(np.int32)
    return scores, labels


def _input(request: InferRequest, spec: dict[str, Any]) -> np.ndarray:
    """The input named in ``spec`` as a numpy array, checked against the declared datatype and
    shape (InvalidInput, like Triton's INVALID_ARGUMENT, when it does not match)."""
    name = spec["name"]
    tensor = request.get_input_by_name(name)
    if tensor is None:
        raise InvalidInput(f"model scorer: input {name} is missing")
    if tensor.datatype != spec["datatype"]:
        raise InvalidInput(
            f"model scorer: input {name} has datatype {tensor.datatype}, "
            f"expected {spec['datatype']}"
        )
    shape = list(tensor.shape)
    want = spec["shape"]
    if len(shape) != len(want) or any(w not in (-1, s) for s, w in zip(shape, want, strict=True)):
        raise InvalidInput(f"model scorer: input {name} has shape {shape}, expected {want}")
    array: np.ndarray = tensor.as_numpy()
    return array


class Scorer(kserve.Model):  # type: ignore[misc]
    """The scorer formula as a KServe custom model (sync ``predict``: one request at a time)."""

    def __init__(self, name: str, version: str, declare_tensors: bool = True) -> None:
        super().__init__(name)
        self.version = version
        self.declare_tensors = declare_tensors
        self.ready = False

    def load(self) -> bool:
        self.ready = True
        return True

    def get_input_types(self) -> list[dict[str, Any]]:
        return [dict(spec) for spec in INPUTS] if self.declare_tensors else []

    def get_output_types(self) -> list[dict[str, Any]]:
        return [dict(spec) for spec in OUTPUTS] if self.declare_tensors else []

    def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        if not isinstance(payload, InferRequest):
            raise InvalidInput("model scorer speaks the Open Inference Protocol (v2) only")
        features, count = (_input(payload, spec) for spec in INPUTS)
        if features.shape[0] != count.shape[0]:
            raise InvalidInput(
                f"model scorer: FEATURES has {features.shape[0]} rows, COUNT {count.shape[0]}"
            )
        if (count == INVALID_COUNT).any():
            raise InvalidInput(f"model scorer: COUNT {INVALID_COUNT} is not a valid count")
        if (count == CRASH_COUNT).any():
            raise RuntimeError(f"model scorer crashed on COUNT {CRASH_COUNT}")
        scores, labels = score(features, count)
        computed = {"SCORE": scores, "LABEL": labels}
        wanted = [o.name for o in payload.request_outputs or ()] or [o["name"] for o in OUTPUTS]
        unknown = sorted(set(wanted) - set(computed))
        if unknown:
            raise InvalidInput(f"model scorer has no output(s) {unknown}")
        outputs = []
        for spec in OUTPUTS:
            if spec["name"] in wanted:
                array = computed[spec["name"]]
                out = InferOutput(spec["name"], list(array.shape), spec["datatype"])
                out.set_data_from_numpy(array, binary_data=True)
                outputs.append(out)
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=outputs,
            model_version=self.version,
        )


class _LoopbackGrpcServer:
    """A ``grpc.aio.Server`` whose ``add_insecure_port("[::]:P")`` binds ``host:P`` instead."""

    def __init__(self, server: Any, host: str) -> None:
        self._server = server
        self._host = host

    def add_insecure_port(self, address: str) -> int:
        port = address.rsplit(":", 1)[1]
        bound: int = self._server.add_insecure_port(f"{self._host}:{port}")
        log.info("gRPC bound to %s:%s (KServe asked for %s)", self._host, port, address)
        return bound

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class _AioWithHost:
    """``grpc.aio`` as KServe's gRPC server module sees it, with ``server()`` bound to host."""

    def __init__(self, host: str) -> None:
        self._host = host

    def server(self, *args: Any, **kwargs: Any) -> _LoopbackGrpcServer:
        return _LoopbackGrpcServer(grpc.aio.server(*args, **kwargs), self._host)

    def __getattr__(self, name: str) -> Any:
        return getattr(grpc.aio, name)


def bind_to(host: str) -> None:
    """Make KServe's REST and gRPC servers listen on ``host`` only: KServe 0.21 hard-codes
    ``0.0.0.0`` (uvicorn) and ``[::]`` (gRPC) and has no argument or variable to change them."""
    rest_server_class = model_server.RESTServer

    class LoopbackRESTServer(rest_server_class):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.config.host = host  # uvicorn reads it when it binds, at start

    model_server.RESTServer = LoopbackRESTServer
    grpc_server.aio = _AioWithHost(host)


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser], description=__doc__)
    parser.add_argument("--bind_address", default="127.0.0.1", help="address both servers bind")
    parser.add_argument("--model_version", default="1", help="model_version of every response")
    parser.add_argument(
        "--declare_tensors",
        default=True,
        type=lambda v: v.lower() in ("1", "true", "yes"),
        help="list the inputs and outputs in ModelMetadata (false: list none)",
    )
    args, _ = parser.parse_known_args()
    bind_to(args.bind_address)
    model = Scorer(args.model_name, args.model_version, args.declare_tensors)
    model.load()
    kserve.ModelServer(workers=1).start([model])


if __name__ == "__main__":
    main()
