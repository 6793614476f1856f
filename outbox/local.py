"""``python -m outbox.local`` (``make run``): the local runner, ``outbox.hosting.local``."""

import sys

from outbox.hosting.local import main

if __name__ == "__main__":
    sys.exit(main())
