#!/usr/bin/env bash
# Put this checkout on a venv's import path for development: writes rowbatch-dev.pth (one line,
# the checkout's absolute path) into the venv's site-packages, so `python -m harness`,
# `python -m bench` and `import harness` work from any directory. harness/ and bench/ are the
# repository's test harness and benchmarks, not part of the installed package (the wheel holds
# rowbatch alone; docs/architecture.md, "Layout"), so the editable install does not provide them.
# Idempotent: rewrites the same line each time. The package itself is rowbatch/, one real
# directory, installed editable (scripts/setup.sh).
# Usage: scripts/dev-path.sh VENV_PYTHON   (e.g. .venv/bin/python)
set -euo pipefail
python=${1:?usage: scripts/dev-path.sh VENV_PYTHON}
root=$(cd "$(dirname "$0")/.." && pwd)
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$root" > "$site/rowbatch-dev.pth"
