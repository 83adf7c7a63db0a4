"""``python -m consumer``: the same as the ``rowbatch-consumer`` command."""

import sys

from consumer.service.cli import main

sys.exit(main())
