"""``scorer`` served by a real tritonserver in two versions at once
(:func:`harness.model_repository.scorer_versions_repository`, v2 slowed to 200 ms per execution):
each version equals its reference, the two differ exactly on the rows whose ``COUNT % 10 == 7``
(every LABEL there flips), each response names the version that answered, and what Triton
reports about the versions (what discovery reads): ModelMetadata lists both, the model config's
``version_policy`` is ``all``, and a request without ``model_version`` gets the highest."""

from __future__ import annotations

import ast
import inspect
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient

from harness import reference_models
from harness.model_repository import SCORER, SCORER_V2_MODEL, scorer_versions_repository
from harness.reference_models import FEATURE_DIM, score, score_v2, v2_differs
from harness.service import RunDir
from harness.triton import TritonService

pytestmark = pytest.mark.timeout(180)

MODEL = "scorer"
V2_DELAY_MS = 200.0
ROWS = 1_000
REQUEST_ROWS = 250  # under the config's max_batch_size (512)

Answer = tuple[npt.NDArray[np.float32], npt.NDArray[np.int32], str]


@pytest.fixture(scope="module")
def client(
    run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpcclient.InferenceServerClient]:
    """A gRPC client of a tritonserver (free ports) serving both versions of ``scorer``."""
    repository = scorer_versions_repository(
        tmp_path_factory.mktemp("scorer-versions"), v2_delay_ms=V2_DELAY_MS
    )
    service = TritonService(run_dir, repository, name="triton-scorer-versions")
    try:
        endpoint = service.start()
        grpc_client = grpcclient.InferenceServerClient(endpoint.grpc_url)
        try:
            yield grpc_client
        finally:
            grpc_client.close()
    finally:
        service.stop()


def rows() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """COUNT 0..999; FEATURES around a per-row mean in [-1, 1], so both labels occur."""
    rng = np.random.default_rng(20240607)
    means = rng.uniform(-1.0, 1.0, size=(ROWS, 1))
    features = (means + rng.normal(0.0, 1.0, size=(ROWS, FEATURE_DIM))).astype(np.float32)
    return features, np.arange(ROWS, dtype=np.int64).reshape(ROWS, 1)


def infer(
    client: grpcclient.InferenceServerClient,
    features: npt.NDArray[np.float32],
    count: npt.NDArray[np.int64],
    version: str,
) -> Answer:
    """One request (``version`` ``""``: none named, as tritonclient sends by default): SCORE,
    LABEL and the response's ``model_version``."""
    inputs = [
        grpcclient.InferInput("FEATURES", list(features.shape), "FP32"),
        grpcclient.InferInput("COUNT", list(count.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(count)
    result = client.infer(MODEL, inputs, model_version=version)
    return (
        result.as_numpy("SCORE"),
        result.as_numpy("LABEL"),
        str(result.get_response().model_version),
    )


def infer_all(
    client: grpcclient.InferenceServerClient,
    features: npt.NDArray[np.float32],
    count: npt.NDArray[np.int64],
    version: str,
) -> Answer:
    """All rows, in requests of :data:`REQUEST_ROWS`; the version is the one every response
    names (asserted to be the same)."""
    answers = [
        infer(client, features[i : i + REQUEST_ROWS], count[i : i + REQUEST_ROWS], version)
        for i in range(0, len(count), REQUEST_ROWS)
    ]
    versions = {a[2] for a in answers}
    assert len(versions) == 1, versions
    return (
        np.concatenate([a[0] for a in answers]),
        np.concatenate([a[1] for a in answers]),
        versions.pop(),
    )


def test_versions_equal_their_references_and_differ_on_the_known_rows(
    client: grpcclient.InferenceServerClient,
) -> None:
    features, count = rows()
    score1, label1, answered1 = infer_all(client, features, count, "1")
    score2, label2, answered2 = infer_all(client, features, count, "2")
    assert (answered1, answered2) == ("1", "2")
    assert (score1.dtype, label1.dtype) == (np.dtype(np.float32), np.dtype(np.int32))
    assert score1.shape == label2.shape == (ROWS, 1)

    np.testing.assert_array_equal(score1, score(features, count)[0])
    np.testing.assert_array_equal(label1, score(features, count)[1])
    np.testing.assert_array_equal(score2, score_v2(features, count)[0])
    np.testing.assert_array_equal(label2, score_v2(features, count)[1])

    known = (count % 10 == 7).ravel()
    np.testing.assert_array_equal(v2_differs(count).ravel(), known)
    np.testing.assert_array_equal((score1 != score2).ravel(), known)
    np.testing.assert_array_equal((label1 != label2).ravel(), known)  # every one flips
    assert known.sum() == ROWS // 10
    flipped = label1.ravel()[known]
    assert 20 < flipped.sum() < known.sum() - 20, "both labels among the rows that differ"


def test_triton_reports_both_versions_and_serves_the_highest_by_default(
    client: grpcclient.InferenceServerClient,
) -> None:
    """What model discovery sees with two versions served (Triton 2.51)."""
    assert client.get_model_metadata(MODEL, as_json=True)["versions"] == ["1", "2"]
    for version in ("1", "2"):
        metadata = client.get_model_metadata(MODEL, model_version=version, as_json=True)
        assert metadata["versions"] == [version]
        assert client.is_model_ready(MODEL, model_version=version)
    assert client.is_model_ready(MODEL)
    assert not client.is_model_ready(MODEL, model_version="3")

    config = client.get_model_config(MODEL, as_json=True)["config"]
    assert config["version_policy"] == {"all": {}}
    assert config["parameters"]["v2_delay_ms"] == {"string_value": f"{V2_DELAY_MS:g}"}
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["version"], m["state"]) for m in index] == [
        (MODEL, "1", "READY"),
        (MODEL, "2", "READY"),
    ]

    features, count = rows()
    assert infer(client, features[:8], count[:8], "")[2] == "2"


def test_v2_delay_slows_version_2_only(client: grpcclient.InferenceServerClient) -> None:
    features, count = rows()
    features, count = features[:32], count[:32]
    infer(client, features, count, "1")  # warm
    elapsed: dict[str, list[float]] = {"1": [], "2": []}
    for version in ("1", "2", "1", "2", "1", "2"):
        started = time.monotonic()
        assert infer(client, features, count, version)[2] == version
        elapsed[version].append(time.monotonic() - started)
    print(f"\nrequest seconds: v1 {elapsed['1']}, v2 {elapsed['2']}")
    assert min(elapsed["2"]) >= V2_DELAY_MS / 1e3
    assert max(elapsed["1"]) < V2_DELAY_MS / 1e3
    assert statistics.median(elapsed["1"]) < 0.05


def _body(source: str, name: str) -> str:
    """Function ``name``'s statements in ``source`` without its docstring, as an AST dump."""
    [function] = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


@pytest.mark.parametrize("function", ["score", "v2_differs", "score_v2"])
def test_version_2_copies_match_reference(function: str) -> None:
    """Version 2's model file cannot import the project, so it carries copies."""
    model_source = SCORER_V2_MODEL.read_text(encoding="utf-8")
    reference = inspect.getsource(reference_models)
    assert _body(model_source, function) == _body(reference, function)
    for constant in (
        f"V2_DIFFERS_MODULUS = {reference_models.V2_DIFFERS_MODULUS}",
        f"V2_DIFFERS = {reference_models.V2_DIFFERS}",
    ):
        assert f"\n{constant}\n" in model_source


def test_repository_layout(tmp_path: Path) -> None:
    """Version 1 is the deploy model's file itself; version 2 is not in the deploy tree."""
    repository = scorer_versions_repository(tmp_path, name="candidate")
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["candidate/1/model.py", "candidate/2/model.py", "candidate/config.pbtxt"]
    version_1 = (repository / "candidate" / "1" / "model.py").read_bytes()
    assert version_1 == (SCORER / "1" / "model.py").read_bytes()
    assert not (SCORER / "2").exists()
    config = (repository / "candidate/config.pbtxt").read_text(encoding="utf-8")
    assert '\nname: "candidate"\n' in config
    assert 'string_value: "0"' in config
