"""``python -m rowbatch.consumer``: the same as the ``rowbatch-consumer`` command."""

import sys

from rowbatch.consumer.service.cli import entry

sys.exit(entry())
