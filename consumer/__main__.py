import sys

from consumer.service.cli import main

sys.exit(main())
