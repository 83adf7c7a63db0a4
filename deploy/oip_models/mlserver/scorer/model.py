"""MLServer model "scorer": the formula of the Triton ``scorer`` (deploy/models/scorer), served
over the Open Inference Protocol by MLServer 1.7.1 (harness/mlserver.py runs it).

FEATURES [n, 16] FP32 + COUNT [n, 1] INT64 -> SCORE [n, 1] FP32 + LABEL [n, 1] INT32, with
``SCORE = tanh(mean(FEATURES)) + 0.01 * log1p(max(COUNT, 0))``, ``LABEL = SCORE > 0``.
``score`` is a copy of ``harness.reference_models.score`` (a model file cannot import the
project): keep them identical.

Two rows make it fail, for the error-mapping tests:

- a non-finite FEATURES value: :class:`mlserver.errors.InferenceError` (HTTP 400), which
  MLServer's gRPC server answers with INVALID_ARGUMENT (a model error: the rows are bad);
- COUNT == ``CRASH_COUNT``: a plain ``RuntimeError``, which it answers with INTERNAL.

With adaptive batching (``max_batch_size`` > 1 in model-settings.json) one failure fails every
request MLServer merged into that batch.
"""

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse

#: COUNT value that makes the model raise a plain exception (gRPC INTERNAL).
CRASH_COUNT = -999_999


def score(features, count):
    """SCORE and LABEL for the rows of one (merged) request (copy of the reference)."""
    mean = features.astype(np.float64).mean(axis=1, keepdims=True)
    counts = np.maximum(count.astype(np.float64), 0.0)
    scores = (np.tanh(mean) + 0.01 * np.log1p(counts)).astype(np.float32)
    labels = (scores > 0).astype(np.int32)
    return scores, labels


class ScorerModel(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        tensors = {inp.name: NumpyCodec.decode_input(inp) for inp in payload.inputs}
        features = tensors["FEATURES"].reshape(-1, 16)
        count = tensors["COUNT"].reshape(-1, 1)
        finite = np.isfinite(features).all(axis=1)
        if not finite.all():
            rows = np.flatnonzero(~finite)[:5].tolist()
            raise InferenceError(f"FEATURES must be finite; rows {rows} are not")
        if (count == CRASH_COUNT).any():
            raise RuntimeError(f"scorer crashed on COUNT {CRASH_COUNT}")
        scores, labels = score(features, count)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output("SCORE", scores),
                NumpyCodec.encode_output("LABEL", labels),
            ],
        )
