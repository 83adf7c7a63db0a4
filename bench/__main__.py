"""``python -m bench``: the benchmark command line (:func:`bench.cli.main`)."""

from bench.cli import main

raise SystemExit(main())
