#!/usr/bin/env bash
# Idempotent set-up for a fresh machine of this project's kind (Debian 12, Python 3.11):
# system packages (PostgreSQL, Java, Maven, Prometheus) when missing, then the project's venv
# (rowbatch installed editable, plus this checkout on its path for harness/ and bench/),
# then the model servers' own venvs (tritonserver...: `python -m harness server-venvs`), made
# once into ${ROWBATCH_CACHE:-~/.cache/rowbatch}/venvs so no test waits on pip. Kafka's jars
# are fetched from Maven Central by the launcher on first start into the same cache.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python >= 3.11 is required (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11"

missing_pkgs=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing_pkgs+=(postgresql)
command -v java >/dev/null 2>&1 || missing_pkgs+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing_pkgs+=(maven)
command -v promtool >/dev/null 2>&1 || missing_pkgs+=(prometheus)
if ((${#missing_pkgs[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    die "missing system packages: ${missing_pkgs[*]}. Install them: sudo apt-get install -y ${missing_pkgs[*]}"
  fi
  say "installing ${missing_pkgs[*]} from Debian's packages"
  apt-get update -qq || die "apt-get update failed: no network to the Debian mirror?"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_pkgs[@]}" >/dev/null \
    || die "apt-get install ${missing_pkgs[*]} failed"
fi
if [ ! -x /usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator ]; then
  command -v go >/dev/null 2>&1 \
    || die "neither the Pub/Sub emulator (Debian package google-cloud-cli-pubsub-emulator) nor Go (for the pstest fallback) is installed"
  say "Pub/Sub emulator absent: the tests will build and use Google's Go fake 'pstest'"
fi

command -v kubectl >/dev/null 2>&1 \
  || say "kubectl absent: tests/unit/deploy/test_k8s.py (kubectl kustomize deploy/k8s) will be skipped, or fail where CI is set"

stamp=.venv/.rowbatch-installed
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$PYTHON" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing rowbatch and its dev dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip \
    || die "pip could not reach the package index"
  if .venv/bin/python -m pip show -q nvidia-pytriton >/dev/null 2>&1; then
    # A .venv from before the model servers moved to venvs of their own: drop the server and
    # take the numpy 2 / pyarrow releases its pins held back
    say "removing nvidia-pytriton from .venv (tritonserver now runs from its own venv)"
    .venv/bin/python -m pip uninstall -q -y nvidia-pytriton || die "pip uninstall nvidia-pytriton failed"
    upgrade=(--upgrade numpy pyarrow)
  else
    upgrade=()
  fi
  .venv/bin/python -m pip install -q -e '.[dev]' "${upgrade[@]}" \
    || die "pip install -e '.[dev]' failed (see above)"
  echo "$want" > "$stamp"
fi
# harness/ and bench/ are not in the installed package (rowbatch): .venv finds them through a
# .pth file naming this checkout (scripts/dev-path.sh), written on every run
bash scripts/dev-path.sh .venv/bin/python || die "could not write .venv's rowbatch-dev.pth"
# The model servers' venvs (a few seconds to check when made; minutes the first time), all
# but llama's: llama-cpp-python compiles llama.cpp (~8-9 minutes on 2 cores), so
# scripts/test.sh builds that one in the background instead (`python -m harness server-venvs
# llama` makes it in the foreground)
server_venvs=$(.venv/bin/python -c 'from harness.server_venv import SERVER_VENVS; print(" ".join(n for n in SERVER_VENVS if n != "llama"))')
# shellcheck disable=SC2086 # the names are words
.venv/bin/python -m harness server-venvs $server_venvs | sed 's/^/[setup] server venv /' \
  || die "could not make the model servers' venvs (see above; ROWBATCH_SERVER_PYTHON picks their interpreter)"
say "ready"
