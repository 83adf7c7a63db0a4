"""Triton Python-backend model "scorer", version 2: a candidate that differs from version 1
(``deploy/models/scorer/1/model.py``) on a known subset of rows, optionally slower.

Not a module of this project: :func:`harness.model_repository.scorer_versions_repository` copies
it as ``<name>/2/model.py`` into a temporary model repository (a model file cannot import this
project). Version 1's SCORE / LABEL are computed as in ``deploy/models/scorer``; on the rows whose
``COUNT % 10 == 7`` (numpy's floored modulo) SCORE becomes ``-|s| - 0.5`` where version 1's
LABEL is 1 and ``|s| + 0.5`` where it is 0, so LABEL flips on every one of those rows.
``score``, ``v2_differs`` and ``score_v2`` are copies of those of ``harness.reference_models``
(with its constants): keep them identical.

Each execution waits until ``v2_delay_ms`` (the config's parameter, 0 when absent) has passed
since it began, asleep: every request version 2 answers takes at least that long.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

V2_DIFFERS_MODULUS = 10
V2_DIFFERS = 7


def score(features: Any, count: Any) -> tuple[Any, Any]:
    """SCORE and LABEL of version 1 for one request's rows (copy of the reference)."""
    mean = features.astype(np.float64).mean(axis=1, keepdims=True)
    counts = np.maximum(count.astype(np.float64), 0.0)
    scores = (np.tanh(mean) + 0.01 * np.log1p(counts)).astype(np.float32)
    labels = (scores > 0).astype(np.int32)
    return scores, labels


def v2_differs(count: Any) -> Any:
    """Which rows version 2 answers differently (copy of the reference)."""
    return np.asarray(count % V2_DIFFERS_MODULUS == V2_DIFFERS, dtype=np.bool_)


def score_v2(features: Any, count: Any) -> tuple[Any, Any]:
    """SCORE and LABEL of version 2 for one request's rows (copy of the reference)."""
    scores, labels = score(features, count)
    magnitude = np.abs(scores)
    flipped = np.where(labels == 1, -magnitude - np.float32(0.5), magnitude + np.float32(0.5))
    differs = v2_differs(count.reshape(scores.shape))
    scores = np.where(differs, flipped, scores).astype(np.float32)
    return scores, (scores > 0).astype(np.int32)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = json.loads(args["model_config"]).get("parameters", {})
        delay = parameters.get("v2_delay_ms", {}).get("string_value", "0")
        self.delay_s = float(delay) / 1e3

    def execute(self, requests: list[Any]) -> list[Any]:
        started = time.monotonic()
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            scores, labels = score_v2(features, count)
            outputs = [pb_utils.Tensor("SCORE", scores), pb_utils.Tensor("LABEL", labels)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        remaining = self.delay_s - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        return responses
