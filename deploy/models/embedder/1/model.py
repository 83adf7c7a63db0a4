"""Triton Python-backend model "embedder": TEXT [n, 1] bytes -> EMBEDDING [n, 384] float32.

Hashed character 3-grams, L2-normalised. ``embed`` is a copy of
``harness.reference_models.embed`` (this file cannot import the project): keep them identical.
"""

import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

EMBEDDING_DIM = 384


def embed(text):
    """The 384-float, L2-normalised embedding of one text (copy of the reference)."""
    padded = "^^" + text + "$$"
    counts = np.zeros(EMBEDDING_DIM, dtype=np.float64)
    for i in range(len(padded) - 2):
        counts[zlib.crc32(padded[i : i + 3].encode("utf-8")) % EMBEDDING_DIM] += 1.0
    return (counts / np.linalg.norm(counts)).astype(np.float32)


def _text(value):
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            rows = [embed(_text(v)) for v in texts]
            out = np.stack(rows) if rows else np.zeros((0, EMBEDDING_DIM), np.float32)
            tensor = pb_utils.Tensor("EMBEDDING", out)
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
