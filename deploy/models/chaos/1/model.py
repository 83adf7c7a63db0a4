"""Triton Python-backend model "chaos": the "embedder" model (same inputs, outputs, values)
with faults injected at run time, for testing clients' error handling against real Triton.

The faults come from a JSON file whose path is in ``$ROWBATCH_CHAOS_CONTROL`` (set on the
tritonserver process; ``harness.chaos.ChaosControl`` writes it atomically). The file is
stat-ed on every execute and re-read when its inode, mtime or size changes; a missing file
means no faults. Keys, all optional:

- ``unavailable_until`` (unix time): every request answers UNAVAILABLE until then;
- ``unavailable_fraction`` (0..1): that fraction of requests answers UNAVAILABLE,
  deterministically (an accumulator adds the fraction per request and fails the request each
  time it reaches 1; it restarts at 0 whenever the file changes);
- ``delay_s``: sleep this long at the start of every batch execute;
- ``reject_marker`` (string): a request any of whose TEXT rows contains it answers
  INVALID_ARGUMENT.

Checks are made per request in that order. ``embed`` is a copy of
``harness.reference_models.embed``: keep them identical.
"""

import json
import os
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

EMBEDDING_DIM = 384
CONTROL_ENV = "ROWBATCH_CHAOS_CONTROL"
KNOWN_KEYS = {"unavailable_until", "unavailable_fraction", "delay_s", "reject_marker"}


def embed(text):
    """The 384-float, L2-normalised embedding of one text (copy of the reference)."""
    padded = "^^" + text + "$$"
    counts = np.zeros(EMBEDDING_DIM, dtype=np.float64)
    for i in range(len(padded) - 2):
        counts[zlib.crc32(padded[i : i + 3].encode("utf-8")) % EMBEDDING_DIM] += 1.0
    return (counts / np.linalg.norm(counts)).astype(np.float32)


def _text(value):
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _log(message):
    logger = getattr(pb_utils, "Logger", None)
    if logger is not None:
        logger.log_info("chaos: " + message)


class TritonPythonModel:
    def initialize(self, args):
        self._path = os.environ.get(CONTROL_ENV, "")
        self._key = None
        self._control = {}
        self._accumulator = 0.0
        _log(f"control file {self._path or '(none: $' + CONTROL_ENV + ' unset)'}")

    def _refresh(self):
        """Re-read the control file if it changed since the last execute."""
        if not self._path:
            return
        try:
            st = os.stat(self._path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = None
        if key == self._key:
            return
        self._key = key
        self._accumulator = 0.0
        control = {}
        if key is not None:
            try:
                with open(self._path, encoding="utf-8") as f:
                    control = json.load(f)
                if not isinstance(control, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                _log(f"ignoring unreadable control file {self._path}: {exc}")
                control = {}
        unknown = sorted(set(control) - KNOWN_KEYS)
        if unknown:
            _log(f"ignoring unknown control keys {unknown}")
        self._control = control
        _log(f"control now {json.dumps(control, sort_keys=True)}")

    def _fault(self, texts):
        """A TritonError for this request, or None to answer it normally."""
        control = self._control
        until = control.get("unavailable_until")
        if until is not None and time.time() < float(until):
            return pb_utils.TritonError(
                f"chaos: unavailable until {float(until):.3f}", pb_utils.TritonError.UNAVAILABLE
            )
        marker = control.get("reject_marker")
        if marker and any(marker in t for t in texts):
            return pb_utils.TritonError(
                f"chaos: rejected, TEXT contains {marker!r}", pb_utils.TritonError.INVALID_ARG
            )
        fraction = float(control.get("unavailable_fraction") or 0.0)
        if fraction > 0.0:
            self._accumulator += fraction
            if self._accumulator >= 1.0:
                self._accumulator -= 1.0
                return pb_utils.TritonError(
                    "chaos: unavailable (fraction)", pb_utils.TritonError.UNAVAILABLE
                )
        return None

    def execute(self, requests):
        self._refresh()
        delay = float(self._control.get("delay_s") or 0.0)
        if delay > 0.0:
            time.sleep(delay)
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            texts = [_text(v) for v in raw]
            error = self._fault(texts)
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            rows = [embed(t) for t in texts]
            out = np.stack(rows) if rows else np.zeros((0, EMBEDDING_DIM), np.float32)
            tensor = pb_utils.Tensor("EMBEDDING", out)
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
        return responses
