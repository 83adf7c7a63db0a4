"""Triton Python-backend model "expander" (and "expander_wide", which links this file):
X [n, 1] int64 -> Y [n, dim] float32, ``dim`` read from the output's dims in config.pbtxt
(2048 for expander, 4096 for expander_wide).

``Y[i, j] = sin(X[i] + j)`` (float64, returned as float32): 8 bytes in, 4 * dim bytes out per
row, for memory-budget tests. ``expand`` is a copy of ``harness.reference_models.expand``
(this file cannot import the project): keep them identical.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

EXPAND_DIM = 2048


def expand(x, dim=EXPAND_DIM):
    """Y [n, dim] float32 for X [n, 1] int64 (copy of the reference)."""
    phase = x.astype(np.float64).reshape(-1, 1) + np.arange(dim, dtype=np.float64)
    return np.asarray(np.sin(phase), dtype=np.float32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        (output,) = [o for o in config["output"] if o["name"] == "Y"]
        (self.dim,) = (int(d) for d in output["dims"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            tensor = pb_utils.Tensor("Y", expand(x, self.dim))
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
