"""Write a tiny llama-architecture GGUF model with seeded random weights (~0.5 MB), for
llama.cpp's servers in the integration tests: nothing is downloaded from a model hub.

Run it with the interpreter of the llama server venv (the ``gguf`` package lives only there,
not in the project's .venv)::

    <llama venv>/bin/python harness/tiny_gguf.py OUT.gguf

:func:`harness.llama.tiny_model` does that once per machine and caches the file.

The model: 2 layers, embedding width 64, 4 heads, trained context 512, F32 weights. Its
vocabulary is byte level, in the form llama.cpp's SentencePiece ("llama") tokenizer accepts:
``<unk>`` (0), ``<s>`` (1, BOS), ``</s>`` (2, EOS), the 256 byte tokens ``<0x00>``..``<0xFF>``
(type BYTE: 3..258) and ``▁`` (259, the SentencePiece space). Any UTF-8 text tokenizes: each
character without a token of its own falls back to its bytes, so a prompt costs about one token
per byte (a space is one ``▁`` token, BOS one more). The output layer's rows are zero except for
printable ASCII bytes (0x20..0x7E), so greedy decoding (temperature 0) always picks a printable
character: outputs are valid text, never EOS (generation stops at ``max_tokens`` or ``n_ctx``).
Pooling is MEAN, for ``/v1/embeddings`` (one vector of width 64 per input). The chat template
(``tokenizer.chat_template``) is a small Jinja one: ``<|role|>content`` per message, then
``<|assistant|>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: Bump when the written model changes: the cached file is keyed by it (harness.llama).
VERSION = 1
SEED = 20261207
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_FF = 128
CONTEXT_LENGTH = 512
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0
FIRST_BYTE_ID = 3
SPACE_PIECE = "\u2581"  # SentencePiece's word-boundary mark, which llama.cpp puts for " "
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf.TokenType values) of the byte vocabulary."""
    normal, unknown, control, byte = 1, 2, 3, 6
    tokens = ["<unk>", "<s>", "</s>"]
    types = [unknown, control, control]
    for value in range(256):
        tokens.append(f"<0x{value:02X}>")
        types.append(byte)
    tokens.append(SPACE_PIECE)
    types.append(normal)
    scores = [0.0] * len(tokens)
    return tokens, scores, types


def write(path: Path) -> None:
    """Write the model to ``path`` (through a temporary file beside it)."""
    import gguf  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - llama venv only

    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(str(part), "llama")
    _add_metadata(writer, gguf)
    _add_tensors(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.replace(path)


def _add_metadata(writer: Any, gguf: Any) -> None:
    tokens, scores, types = vocabulary()
    writer.add_name("rowbatch-tiny")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _add_tensors(writer: Any) -> None:
    rng = np.random.default_rng(SEED)
    n_vocab = len(vocabulary()[0])

    def dense(rows: int, cols: int) -> Any:
        # numpy shape (out, in): gguf stores it as ggml's (in, out), as llama.cpp expects
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def ones(n: int) -> Any:
        return np.ones(n, dtype=np.float32)

    writer.add_tensor("token_embd.weight", dense(n_vocab, N_EMBD) * np.float32(4.0))
    for layer in range(N_LAYER):
        blk = f"blk.{layer}"
        writer.add_tensor(f"{blk}.attn_norm.weight", ones(N_EMBD))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", dense(N_EMBD, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_norm.weight", ones(N_EMBD))
        writer.add_tensor(f"{blk}.ffn_gate.weight", dense(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.weight", dense(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_down.weight", dense(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    output = dense(n_vocab, N_EMBD) * np.float32(8.0)
    printable = np.zeros(n_vocab, dtype=bool)
    printable[FIRST_BYTE_ID + 0x20 : FIRST_BYTE_ID + 0x7F] = True
    output[~printable] = 0.0  # only printable ASCII can win at temperature 0
    writer.add_tensor("output.weight", output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    args = parser.parse_args(argv)
    write(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
