"""``python -m producer``: see :mod:`producer.cli`."""

from producer.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
