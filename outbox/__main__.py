import sys

from outbox.hosting.cli import main

sys.exit(main())
