#!/usr/bin/env bash
# The README's test command: set-up, lint, type-check, the unit tests on each other supported
# Python version present, then the whole test suite on the real services (each started once by
# the test session and stopped at its end) in .venv (Python 3.11).
# Extra arguments go to the main pytest run, e.g. scripts/test.sh -k kafka
#
# Python versions: rowbatch supports 3.11, 3.12 and 3.13. .venv's Python (3.11) runs everything;
# each other version listed in ROWBATCH_PYTHONS (default "3.11 3.12 3.13") that is installed
# (as python3.X on PATH, or under pyenv's versions/) runs the unit tests (tests/unit) from a venv
# of its own, .venv-py3.X in the checkout, made on first use and reinstalled when pyproject.toml
# changes; those versions run in the background during the main run (logs in .stack/test-logs/,
# printed after it), at the lowest CPU priority (nice 19): they use the time the main run's
# integration tests spend waiting on services and barely compete with them for the CPU. A
# version that is not installed is skipped with a note; one whose install or tests fail fails
# the run (the extra arguments do not apply to these runs). ROWBATCH_PYTHONS=3.11 runs .venv's
# tests only. A summary line per version ends the output.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

say() { printf '[test] %s\n' "$*"; }

# Jaeger, the trace backend of the tracing tests (harness/jaeger.py), is built from the Go
# module proxy once per machine: minutes of compiling, so it runs in the background at the
# lowest priority while the checks and the first tests run; a test that needs it before it is
# done waits on the build's lock. Its log: .stack/jaeger-build.log.
if command -v go >/dev/null 2>&1; then
  if ! .venv/bin/python -c 'import sys; from harness.jaeger import binary_path; sys.exit(not binary_path().is_file())'; then
    mkdir -p .stack
    say "building Jaeger in the background (log: .stack/jaeger-build.log)"
    nohup nice -n 19 .venv/bin/python -m harness jaeger-build >.stack/jaeger-build.log 2>&1 </dev/null &
  fi
else
  say "Go absent: the tracing tests (Jaeger is built with Go) will fail; install Go 1.24 or newer"
fi

# The llama server venv (harness/llama.py; llama-cpp-python compiles llama.cpp from source,
# ~8-9 minutes on 2 cores), which scripts/setup.sh leaves out: built in the background at the
# lowest priority like Jaeger, on 2 compile jobs; the tests that use it wait on its lock. Its
# log: .stack/llama-build.log.
if ! .venv/bin/python -c 'import sys; from harness.server_venv import LLAMA_VENV; sys.exit(not LLAMA_VENV.is_ready())'; then
  mkdir -p .stack
  say "building the llama server venv in the background (log: .stack/llama-build.log)"
  CMAKE_BUILD_PARALLEL_LEVEL=2 nohup nice -n 19 .venv/bin/python -m harness server-venvs llama \
    >.stack/llama-build.log 2>&1 </dev/null &
fi

echo "[test] ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "[test] mypy --strict"
.venv/bin/mypy
# The docs site (mkdocs.yml; about two seconds): strict, so a link to a missing page, anchor or
# repository file fails here. Its configuration reference is generated from the settings
# models (scripts/config_reference.py, typed: checked here too, as scripts/ is no package).
echo "[test] docs site (mkdocs build --strict)"
# Never --quiet: it drops the warnings before strict counts them, and the build passes.
.venv/bin/mypy --strict scripts/config_reference.py scripts/mkdocs_hooks.py
if ! docs_log=$(NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict 2>&1); then
  printf '%s\n' "$docs_log" >&2
  exit 1
fi

main_version=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
main_full=$(.venv/bin/python -c 'import platform; print(platform.python_version())')
summary=()
failed=0

# The interpreter of version $1 (e.g. 3.12), or nothing: python3.12 on PATH (a pyenv shim for a
# version that is not selected fails to run, so each candidate is asked its version), else the
# newest pyenv install of it.
find_python() {
  local version=$1 candidate
  local -a candidates=()
  candidate=$(command -v "python$version" 2>/dev/null || true)
  [ -n "$candidate" ] && candidates+=("$candidate")
  local pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  while IFS= read -r candidate; do
    candidates+=("$candidate")
  done < <(ls -d "$pyenv_root/versions/$version".*/bin/"python$version" 2>/dev/null | sort -V -r)
  for candidate in "${candidates[@]}"; do
    if [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$version" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 0
}

# Make (or reuse) .venv-py$1 from interpreter $2 with the project and its dev extra installed;
# the stamp is keyed on pyproject.toml and the interpreter's full version.
ensure_venv() {
  local version=$1 python=$2 venv=.venv-py$1
  local stamp=$venv/.rowbatch-installed want
  want="$( (cat pyproject.toml; "$python" -VV) | sha256sum | cut -c1-16)"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$venv/bin/python" -c 'import rowbatch.consumer, harness' 2>/dev/null; then
    return 0
  fi
  if ! "$venv/bin/python" -c 'import sys' 2>/dev/null \
    || [ "$("$venv/bin/python" -VV 2>/dev/null)" != "$("$python" -VV)" ]; then
    say "creating $venv from $python"
    rm -rf "$venv"
    "$python" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q --upgrade pip || return 1
  fi
  say "installing rowbatch and its dev dependencies into $venv"
  "$venv/bin/python" -m pip install -q -e '.[dev]' || return 1
  bash scripts/dev-path.sh "$venv/bin/python" || return 1  # harness/, bench/ (as in setup.sh)
  echo "$want" > "$stamp"
}

# Each other version's venv and unit tests, in parallel with each other (pytest runs on one
# core, and making a venv mostly waits on downloads): its output goes to a log, printed whole
# when it ends, and its summary line to a file.
logs=.stack/test-logs
mkdir -p "$logs"
other_versions() {
  local version python full started installed_s tested_s code
  version=$1
  python=$(find_python "$version")
  if [ -z "$python" ]; then
    say "Python $version: not installed (no python$version on PATH or under pyenv): skipped"
    echo "Python $version: skipped (not installed)" > "$logs/py$version.summary"
    return 0
  fi
  full=$("$python" -c 'import platform; print(platform.python_version())')
  started=$SECONDS
  if ! ensure_venv "$version" "$python"; then
    say "Python $full: pip install -e '.[dev]' into .venv-py$version failed (see above)" >&2
    echo "Python $full: FAILED to install into .venv-py$version" > "$logs/py$version.summary"
    return 1
  fi
  installed_s=$((SECONDS - started))
  say "pytest tests/unit on Python $full (.venv-py$version)"
  started=$SECONDS
  set +e
  ".venv-py$version/bin/python" -m pytest -q tests/unit -p no:cacheprovider
  code=$?
  set -e
  tested_s=$((SECONDS - started))
  if [ "$code" -eq 0 ]; then
    echo "Python $full: unit tests passed (${tested_s} s; venv ready in ${installed_s} s)" \
      > "$logs/py$version.summary"
    return 0
  fi
  echo "Python $full: unit tests FAILED (pytest exit $code)" > "$logs/py$version.summary"
  return 1
}

pids=()
versions=()
set -m  # each background run in a process group of its own, so a stop can end its pytest too
for version in ${ROWBATCH_PYTHONS-3.11 3.12 3.13}; do
  [ "$version" = "$main_version" ] && continue
  rm -f "$logs/py$version.summary"
  ( renice -n 19 -p "$BASHPID" >/dev/null && other_versions "$version" ) \
    > "$logs/py$version.log" 2>&1 &
  pids+=("$!")
  versions+=("$version")
  say "Python $version: venv and unit tests started in the background at nice 19 (log: $logs/py$version.log)"
done
set +m
# Stop the background runs (their process groups) if this script ends early.
trap 'for pid in "${pids[@]}"; do kill -- "-$pid" 2>/dev/null || true; done' EXIT

echo "[test] pytest on Python $main_full (.venv: unit and integration)"
started=$SECONDS
set +e
.venv/bin/python -m pytest -q -ra --durations=15 "$@"
code=$?
set -e
tested_s=$((SECONDS - started))
if [ "$code" -eq 5 ]; then
  say "pytest collected no tests (exit 5): treating as success, but check the selection" >&2
  code=0
fi
if [ "$code" -eq 0 ]; then
  summary=("Python $main_full (.venv): tests passed (${tested_s} s)")
else
  summary=("Python $main_full (.venv): tests FAILED (pytest exit $code)")
  failed=1
fi

for i in "${!pids[@]}"; do
  version=${versions[$i]}
  if ! wait "${pids[$i]}"; then
    failed=1
  fi
  say "--- Python $version (from $logs/py$version.log) ---"
  cat "$logs/py$version.log"
  if [ -f "$logs/py$version.summary" ]; then
    summary+=("$(cat "$logs/py$version.summary")")
  else
    summary+=("Python $version: FAILED (no summary: see $logs/py$version.log)")
    failed=1
  fi
done
trap - EXIT

for line in "${summary[@]}"; do
  say "summary: $line"
done
if [ "$code" -ne 0 ]; then
  exit "$code"
fi
exit "$failed"
