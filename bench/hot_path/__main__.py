"""``python -m bench.hot_path``: the hot-path profile's command line."""

from bench.hot_path.cli import main

main()
