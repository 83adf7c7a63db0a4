"""Triton Python-backend model "expander_wide": X [n, 1] int64 -> Y [n, 4096] float32.

``Y[i, j] = sin(X[i] + j)`` (float64, returned as float32): 8 bytes in, 16,384 bytes out per
row (2048x), for memory-budget tests with wide outputs. ``expand`` is a copy of
``harness.reference_models.expand`` (this file cannot import the project): keep them identical.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

EXPAND_DIM = 4096


def expand(x, dim=EXPAND_DIM):
    """Y [n, dim] float32 for X [n, 1] int64 (copy of the reference)."""
    phase = x.astype(np.float64).reshape(-1, 1) + np.arange(dim, dtype=np.float64)
    return np.asarray(np.sin(phase), dtype=np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            tensor = pb_utils.Tensor("Y", expand(x))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
