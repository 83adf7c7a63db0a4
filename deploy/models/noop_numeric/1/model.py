"""Triton Python-backend model "noop_numeric": FEATURES [n, 16] float32 + COUNT [n, 1] int64 ->
SCORE [n, 1] float32 zeros.

Does no work on the inputs, so a benchmark against it measures the consumer's own CPU per row
(bench/overhead.py).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "FEATURES").shape()[0]
            zeros = np.zeros((rows, 1), dtype=np.float32)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SCORE", zeros)])
            )
        return responses
