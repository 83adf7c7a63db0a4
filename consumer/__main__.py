import sys

from consumer.cli import main

sys.exit(main())
