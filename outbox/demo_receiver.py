"""``python -m outbox.demo_receiver``: the demo receiver, ``outbox.hosting.demo_receiver``."""

import sys

from outbox.hosting.demo_receiver import main

if __name__ == "__main__":
    sys.exit(main())
