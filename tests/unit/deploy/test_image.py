"""deploy/Dockerfile, checked offline (no Docker engine here): every input pinned (the base by
digest, each dependency and the build backend by version and hash, installed with
--require-hashes from wheels only), the wheel built in a builder stage without build isolation
(nothing fetched unpinned) and the runtime stage holding the virtualenv alone; dependencies in a
layer of their own installed before any source is copied, the lock pinning every runtime
dependency of pyproject.toml, and a build context (.dockerignore) that holds what the COPY
instructions name and nothing of the venvs, git, tests, harness or bench."""

from __future__ import annotations

import re
import subprocess
import tomllib

from packaging.requirements import Requirement

from harness.service import REPO_ROOT as ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
LOCK = ROOT / "deploy" / "requirements.lock"
LOCK_SCRIPT = ROOT / "scripts" / "lock.sh"
SOURCE = ("rowbatch", "wire", "consumer", "producer", "pyproject.toml")
BASE_ARG = "PYTHON_BASE"
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _instructions() -> list[tuple[str, str]]:
    """(keyword, arguments) per instruction, continued lines joined, comments left out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending = f"{pending} {stripped}" if pending else stripped
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, rest = pending.partition(" ")
        out.append((keyword, " ".join(rest.split())))
        pending = ""
    assert not pending, "a continued line at the end"
    return out


def _stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage (from its FROM on), in order."""
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in _instructions():
        if keyword == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((keyword, rest))
    return stages


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> dict[str, tuple[str, list[str]]]:
    """Each locked requirement: its canonical name, pinned version and hashes."""
    text = LOCK.read_text()
    entries: dict[str, tuple[str, list[str]]] = {}
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
        lines = [ln.strip() for ln in entry.splitlines() if not ln.strip().startswith("#")]
        spec = " ".join(ln.rstrip("\\").strip() for ln in lines).split()
        if not spec:
            continue
        name, sep, version = spec[0].partition("==")
        assert sep, f"{spec[0]!r} is not pinned with =="
        hashes = [s.removeprefix("--hash=") for s in spec[1:] if s.startswith("--hash=")]
        assert len(hashes) == len(spec) - 1, f"{spec[0]}: only hashes may follow the pin"
        entries[_canonical(name)] = (version, hashes)
    return entries


def _pins() -> dict[str, str]:
    return {name: version for name, (version, _) in _requirements().items()}


def _run_lines(stage: list[tuple[str, str]]) -> list[str]:
    return [rest for keyword, rest in stage if keyword == "RUN"]


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
        rest for k, rest in steps if k == "RUN" and "install" in rest and ".whl" in rest
    ]
    assert "--no-deps" in package_install, "the package's install must not resolve anew"


def test_the_base_image_is_pinned_by_digest() -> None:
    """Every stage starts from the one base, named by an ARG whose value must carry a digest:
    no default, or a default pinned by digest; and the builder refuses a tag alone."""
    steps = _instructions()
    args = [rest for k, rest in steps[: steps.index(next(s for s in steps if s[0] == "FROM"))]]
    [declared] = [a for a in args if a.split("=")[0] == BASE_ARG]
    _, has_default, default = declared.partition("=")
    assert not has_default or DIGEST.search(default), f"the default {default!r} is a tag"
    stages = _stages()
    assert len(stages) == 2, "a builder stage and the runtime stage"
    for stage in stages:
        image = stage[0][1].split()[0]
        assert image == f"${{{BASE_ARG}}}", f"FROM {image}: not the pinned base"
    [guard] = [line for line in _run_lines(stages[0]) if f"${{{BASE_ARG}}}" in line]
    assert f"ARG {BASE_ARG}" in [f"{k} {r}" for k, r in stages[0]], "the guard sees the ARG"
    digest = "0" * 64
    for value, refused in (
        ("python:3.11-slim-bookworm", True),
        ("python:3.11-slim-bookworm@sha256:" + digest, False),
        ("", True),
    ):
        done = subprocess.run(
            ["sh", "-c", guard], env={BASE_ARG: value}, capture_output=True, check=False
        )
        assert (done.returncode != 0) == refused, (value, done.stderr)
    # the runtime stage starts from the same digest as the builder (same Python, same libc)
    assert stages[1][0][1] == f"${{{BASE_ARG}}}"


def test_dependencies_install_only_hashed_wheels_from_the_lock() -> None:
    requirements = _requirements()
    assert requirements
    unhashed = [name for name, (_, hashes) in requirements.items() if not hashes]
    assert not unhashed, f"no hash: {unhashed}"
    for name, (_, hashes) in requirements.items():
        for value in hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", value), (name, value)
    builder = _stages()[0]
    [lock_install] = [line for line in _run_lines(builder) if "-r requirements.lock" in line]
    assert "--require-hashes" in lock_install
    assert "--only-binary :all:" in lock_install, "an sdist would build in an unpinned isolation"
    for keyword, rest in _instructions():
        if keyword == "RUN" and "pip install" in rest and "-r requirements.lock" not in rest:
            assert "--no-deps" in rest and ".whl" in rest, f"an unpinned install: {rest}"
    assert "scripts/lock.sh" in LOCK.read_text().splitlines()[1], "the lock names its script"
    assert "--generate-hashes" in LOCK_SCRIPT.read_text()


def test_the_wheel_is_built_in_the_builder_with_the_locked_backend() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = _pins()
    for spec in pyproject["build-system"]["requires"]:
        requirement = Requirement(spec)
        name = _canonical(requirement.name)
        assert name in pins, f"the build backend's {name} is not in the lock"
        assert requirement.specifier.contains(pins[name]), (spec, pins[name])
    builder, runtime = _stages()
    [build] = [line for line in _run_lines(builder) if "pip wheel" in line]
    assert "--no-build-isolation" in build, "isolation would fetch setuptools unpinned"
    assert "--no-deps" in build
    # The build backend leaves the venv before it is copied; the runtime gets nothing else.
    backend = {_canonical(Requirement(s).name) for s in pyproject["build-system"]["requires"]}
    [uninstall] = [line for line in _run_lines(builder) if "pip uninstall" in line]
    assert backend <= set(uninstall.split())
    copies = [rest for keyword, rest in runtime if keyword == "COPY"]
    assert copies == ["--from=builder /opt/rowbatch /opt/rowbatch"]
    assert not [line for line in _run_lines(runtime) if "pip" in line], "no installs at run time"
    env = " ".join(rest for keyword, rest in runtime if keyword == "ENV")
    assert "PATH=/opt/rowbatch/bin:" in env


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
    for spec in pyproject["project"]["dependencies"]:
        requirement = Requirement(spec)
        version = pins[_canonical(requirement.name)]
        assert requirement.specifier.contains(version), (spec, version)


def test_the_build_context_holds_what_is_copied_and_nothing_else() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "**", "everything is left out unless named"
    kept = {rule[1:] for rule in rules if rule.startswith("!")}
    copied = {  # every source of each COPY from the context (COPY a b ./ names two)
        p
        for k, rest in _instructions()
        if k == "COPY" and "--from=" not in rest
        for p in rest.split()[:-1]
    }
    assert copied <= kept | {"./"}, f"copied but not in the context: {copied - kept}"
    for never in (".venv", ".git", "tests", "harness", "bench", ".stack", "docs"):
        assert not any(k == never or k.startswith(f"{never}/") for k in kept), never
