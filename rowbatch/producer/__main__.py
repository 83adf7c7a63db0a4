"""``python -m rowbatch.producer``: see :mod:`rowbatch.producer.cli`."""

from rowbatch.producer.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
