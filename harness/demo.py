"""The README's main job, run against the local stack.

The consumer does not exist yet (issue #4); for now the demo proves the stack is usable: it
lists the models Triton serves with the batch size rowbatch would target, and runs one batch
through ``embedder``.
"""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as grpcclient

from harness.stack import StackEndpoints


def _target_batch_size(config: dict[str, object]) -> int:
    """The largest preferred batch size, else max_batch_size (DESIGN.md, "Batch size")."""
    dynamic = config.get("dynamic_batching")
    preferred: list[int] = []
    if isinstance(dynamic, dict):
        preferred = [int(x) for x in dynamic.get("preferred_batch_size", [])]
    return max(preferred) if preferred else int(str(config.get("max_batch_size", 0)))


def run_demo(stack: StackEndpoints) -> None:
    client = grpcclient.InferenceServerClient(stack.triton.grpc_url)
    try:
        print("\nModels on Triton:")
        for entry in client.get_model_repository_index(as_json=True).get("models", []):
            name = entry["name"]
            config = client.get_model_config(name, as_json=True)["config"]
            print(
                f"  {name:<10} state={entry.get('state', '?'):<6} "
                f"target batch size={_target_batch_size(config)}"
            )
        texts = np.array([[f"demo row {i}".encode()] for i in range(8)], dtype=np.object_)
        tensor = grpcclient.InferInput("TEXT", list(texts.shape), "BYTES")
        tensor.set_data_from_numpy(texts)
        result = client.infer("embedder", [tensor])
        embeddings = result.as_numpy("EMBEDDING")
        assert embeddings is not None
        norms = np.linalg.norm(embeddings, axis=1)
        print(
            f"\nembedder: {embeddings.shape[0]} rows -> {embeddings.shape[1]}-dim embeddings, "
            f"L2 norms {norms.min():.3f}..{norms.max():.3f}"
        )
    finally:
        client.close()
    print(
        "\nThe consumer (issue #4) will turn this into: publish a table, consume it through "
        "Triton into a result table, print rows/s and latency."
    )
