"""CPU cost per row of the consumer's hot path, in-process, no services: runs
``python -m bench.hot_path`` (see ``bench/hot_path/__init__.py`` for what it measures).

    .venv/bin/python scripts/profile_hot_path.py                      # table, all cases
    .venv/bin/python scripts/profile_hot_path.py --sink parquet --profile 20
    .venv/bin/python scripts/profile_hot_path.py --json out.json
    .venv/bin/python scripts/profile_hot_path.py --per-message --broker   # us/message
    .venv/bin/python scripts/profile_hot_path.py --per-message --vector 256
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code first

from bench.hot_path.cli import main

if __name__ == "__main__":
    main()
