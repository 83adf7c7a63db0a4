"""The generated rows: chunk ``i`` of a :class:`~rowbatch.producer.loadgen.spec.LoadSpec`, a
function of the seed and the index only."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rowbatch.producer.loadgen.spec import LoadSpec


def generate_columns(spec: LoadSpec, index: int) -> dict[str, pa.Array]:
    """The rows of chunk ``index`` (a function of the seed and the index only)."""
    first = index * spec.chunk_rows
    n = max(min(spec.chunk_rows, spec.rows - first), 0)
    rng = np.random.default_rng([spec.seed, 0, index])
    ids = pa.array(np.arange(first, first + n, dtype=np.int64))
    width = spec.row_width
    if spec.kind == "text":
        codes = rng.integers(0, 27, size=(n, width), dtype=np.uint8)
        chars = np.where(codes == 26, ord(" "), codes + ord("a")).astype(np.uint8)
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
        text = pa.LargeStringArray.from_buffers(
            n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())
        ).cast(pa.string())
        return {"id": ids, "text": text}
    features = rng.standard_normal((n, width), dtype=np.float32)
    flat = pa.array(features.reshape(-1), type=pa.float32())
    vectors = pa.FixedSizeListArray.from_arrays(flat, width)
    counts = pa.array(rng.integers(0, 1000, size=n, dtype=np.int64))
    return {"id": ids, "features": vectors, "count": counts}


__all__ = ["generate_columns"]
