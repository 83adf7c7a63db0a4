"""The example models of ``deploy/models`` as :class:`rowbatch.consumer.model.spec.ModelSpec`
values (what model discovery reads from their ``config.pbtxt``), for unit tests and
in-process profiling that have no Triton to ask."""

from __future__ import annotations

from rowbatch.consumer.model.spec import ModelSpec, TensorSpec

EMBEDDER = ModelSpec(
    "embedder",
    "1",
    (TensorSpec("TEXT", "BYTES", (1,)),),
    (TensorSpec("EMBEDDING", "FP32", (384,)),),
    256,
    (64, 128),
)
SCORER = ModelSpec(
    "scorer",
    "1",
    (TensorSpec("FEATURES", "FP32", (16,)), TensorSpec("COUNT", "INT64", (1,))),
    (TensorSpec("SCORE", "FP32", (1,)), TensorSpec("LABEL", "INT32", (1,))),
    512,
    (256,),
)
FIXED_LATENCY = ModelSpec(
    "fixed_latency",
    "1",
    (TensorSpec("FEATURES", "FP32", (16,)), TensorSpec("COUNT", "INT64", (1,))),
    (TensorSpec("SCORE", "FP32", (1,)),),
    256,
)
