"""deploy/Dockerfile, checked offline (no Docker engine here): dependencies in a layer of their
own installed from the pinned lock before any source is copied, the lock pinning every runtime
dependency of pyproject.toml, and a build context (.dockerignore) that holds what the COPY
instructions name and nothing of the venvs, git, tests, harness or bench."""

from __future__ import annotations

import re
import tomllib

from harness.service import REPO_ROOT as ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
LOCK = ROOT / "deploy" / "requirements.lock"
SOURCE = ("rowbatch", "wire", "consumer", "producer", "pyproject.toml")


def _instructions() -> list[tuple[str, str]]:
    out = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword, rest))
    return out


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"{line!r} is not pinned with =="
            pins[_canonical(name)] = version
    return pins


def test_dependencies_are_a_layer_installed_before_the_source_is_copied() -> None:
    steps = _instructions()
    lock_install = next(
        i for i, (k, rest) in enumerate(steps) if k == "RUN" and "-r requirements.lock" in rest
    )
    first_source = next(
        i
        for i, (k, rest) in enumerate(steps)
        if k == "COPY" and rest.split()[0] in (*SOURCE, "README.md")
    )
    assert lock_install < first_source, "a code change would reinstall every dependency"
    copies_before = [rest for k, rest in steps[:lock_install] if k == "COPY"]
    assert copies_before == ["deploy/requirements.lock ./requirements.lock"]
    [package_install] = [
        rest for k, rest in steps if k == "RUN" and "install" in rest and " . " in f"{rest} "
    ]
    assert "--no-deps" in package_install, "the package's install must not resolve anew"


def test_the_lock_pins_every_runtime_dependency() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = {
        _canonical(re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0])
        for spec in pyproject["project"]["dependencies"]
    }
    pins = _pins()
    assert wanted <= set(pins), f"not in the lock: {sorted(wanted - set(pins))}"
    assert "psycopg-binary" in pins and "cramjam" in pins  # the extras' packages too
    assert "rowbatch" not in pins


def test_the_build_context_holds_what_is_copied_and_nothing_else() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "**", "everything is left out unless named"
    kept = {rule[1:] for rule in rules if rule.startswith("!")}
    copied = {rest.split()[0] for k, rest in _instructions() if k == "COPY"}
    copied = {p for c in copied for p in c.split()}  # COPY a b ./ names two sources
    assert copied <= kept | {"./"}, f"copied but not in the context: {copied - kept}"
    for never in (".venv", ".git", "tests", "harness", "bench", ".stack", "docs"):
        assert not any(k == never or k.startswith(f"{never}/") for k in kept), never
