"""Triton Python-backend model "fixed_latency": FEATURES [n, 16] float32 + COUNT [n, 1] int64 ->
SCORE [n, 1] float32, the same SCORE as "scorer".

Each execution (all the requests Triton's dynamic batcher merged) lasts a fixed wall time,
``execute_base_ms + execute_per_row_us x rows`` (the config's parameters), most of it in
``time.sleep``: no CPU, so the model's ceiling is the same however busy the machine is. With one
instance the executions are serial, like one accelerator. ``score`` is a copy of
``harness.reference_models.score``: keep them identical.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def score(features, count):
    """SCORE and LABEL for one request's rows (copy of the reference)."""
    mean = features.astype(np.float64).mean(axis=1, keepdims=True)
    counts = np.maximum(count.astype(np.float64), 0.0)
    scores = (np.tanh(mean) + 0.01 * np.log1p(counts)).astype(np.float32)
    labels = (scores > 0).astype(np.int32)
    return scores, labels


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.base_s = float(parameters["execute_base_ms"]["string_value"]) / 1e3
        self.per_row_s = float(parameters["execute_per_row_us"]["string_value"]) / 1e6

    def execute(self, requests):
        started = time.monotonic()
        responses = []
        rows = 0
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            rows += features.shape[0]
            scores, _ = score(features, count)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SCORE", scores)])
            )
        remaining = self.base_s + self.per_row_s * rows - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        return responses
