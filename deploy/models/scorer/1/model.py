"""Triton Python-backend model "scorer": FEATURES [n, 16] float32 + COUNT [n, 1] int64 ->
SCORE [n, 1] float32 + LABEL [n, 1] int32.

``SCORE = tanh(mean(FEATURES)) + 0.01 * log1p(max(COUNT, 0))``, ``LABEL = SCORE > 0``.
``score`` is a copy of ``harness.reference_models.score``: keep them identical.
"""

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
    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            count = pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()
            scores, labels = score(features, count)
            outputs = [pb_utils.Tensor("SCORE", scores), pb_utils.Tensor("LABEL", labels)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
