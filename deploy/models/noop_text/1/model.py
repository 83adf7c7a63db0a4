"""Triton Python-backend model "noop_text": TEXT [n, 1] bytes -> EMBEDDING [n, 1] float32 zeros.

Does no work on the inputs (it does not even read them), so a benchmark against it measures
the consumer's own CPU per row (bench/overhead.py).
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "TEXT").shape()[0]
            zeros = np.zeros((rows, 1), dtype=np.float32)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", zeros)])
            )
        return responses
