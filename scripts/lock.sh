#!/usr/bin/env bash
# Regenerates deploy/requirements.lock: the image's runtime dependencies (pyproject.toml's
# [project] dependencies, extras included) plus its build backend ([build-system] requires),
# each pinned with the hashes of every file PyPI has for that version, for Python 3.11 on Linux
# (the image's base). deploy/Dockerfile installs it with --require-hashes.
#
#   scripts/lock.sh             # keep the pins, add what is new (pins already there are kept)
#   scripts/lock.sh --upgrade   # every package to its newest version
#
# Needs uv (https://docs.astral.sh/uv/; `pip install uv` into any venv, or UV=/path/to/uv).
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))' \
  | "$uv" pip compile pyproject.toml - \
    --generate-hashes \
    --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 \
    --custom-compile-command scripts/lock.sh \
    --output-file deploy/requirements.lock \
    "$@"
