"""The reference functions for the Triton test models, and their copies in deploy/models."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from harness import reference_models
from harness.reference_models import (
    EMBEDDING_DIM,
    EXPAND_DIM,
    FEATURE_DIM,
    embed,
    embed_batch,
    expand,
    score,
)
from harness.service import REPO_ROOT


@pytest.mark.parametrize("text", ["", "a", "hello world", "日本語 🤖", "x" * 10_000])
def test_embed_is_unit_length_and_deterministic(text: str) -> None:
    vec = embed(text)
    assert vec.shape == (EMBEDDING_DIM,)
    assert vec.dtype == np.float32
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-6
    assert (vec >= 0).all()
    np.testing.assert_array_equal(vec, embed(text))


def test_embed_tells_texts_apart() -> None:
    a, b, c = embed("the cat sat on the mat"), embed("the cat sat on a mat"), embed("zebra")
    assert float(a @ b) > float(a @ c)
    assert embed_batch([]).shape == (0, EMBEDDING_DIM)


def test_score_formula() -> None:
    features = np.full((3, FEATURE_DIM), [[0.0], [1.0], [-1.0]], dtype=np.float32)
    count = np.array([[0], [10], [-3]], dtype=np.int64)
    scores, labels = score(features, count)
    expected = np.array([[0.0], [np.tanh(1.0) + 0.01 * np.log1p(10)], [np.tanh(-1.0)]])
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    assert (scores.dtype, labels.dtype) == (np.dtype(np.float32), np.dtype(np.int32))
    assert labels.ravel().tolist() == [0, 1, 0]


def test_expand_formula() -> None:
    x = np.array([[0], [1], [-7], [10**6]], dtype=np.int64)
    y = expand(x)
    assert y.shape == (4, EXPAND_DIM)
    assert y.dtype == np.float32
    assert y.nbytes == 1024 * x.nbytes  # outputs 1000x inputs: the memory-budget model
    np.testing.assert_allclose(y[0, :3], np.sin([0.0, 1.0, 2.0]), rtol=1e-6)
    np.testing.assert_array_equal(y[1, :-1], y[0, 1:])  # sin(1 + j) = sin(0 + (j + 1))
    np.testing.assert_array_equal(expand(x.ravel()), y)


def _body(tree: ast.FunctionDef) -> str:
    """A function's statements without its docstring, as a comparable AST dump."""
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


def _function(source: str, name: str) -> ast.FunctionDef:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


@pytest.mark.parametrize(
    ("model", "function"),
    [("embedder", embed), ("chaos", embed), ("scorer", score), ("expander", expand)],
)
def test_model_copies_match_reference(model: str, function: Callable[..., Any]) -> None:
    """deploy/models/*/1/model.py cannot import the project, so each carries a copy."""
    model_source = (REPO_ROOT / "deploy" / "models" / model / "1" / "model.py").read_text()
    reference = _function(inspect.getsource(reference_models), function.__name__)
    assert _body(_function(model_source, function.__name__)) == _body(reference)
    constant = {
        "embedder": f"EMBEDDING_DIM = {EMBEDDING_DIM}",
        "chaos": f"EMBEDDING_DIM = {EMBEDDING_DIM}",
        "expander": f"EXPAND_DIM = {EXPAND_DIM}",
    }
    assert constant.get(model, "") in model_source
