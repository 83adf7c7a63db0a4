#!/usr/bin/env bash
# The README's main command: set-up, start the local stack (Kafka, Pub/Sub, Triton,
# PostgreSQL on 127.0.0.1), run the demo job end to end, stop everything.
# Pass --hold to keep the stack running afterwards (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m harness demo "$@"
