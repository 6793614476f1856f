"""The database's wall clock, as this process sees it.

Every time the relay decides on comes from the database's ``now()``. The one timestamp it must
write itself, ``webhook-timestamp`` (receivers reject a signature more than five minutes off),
comes from here too: the database's time at the last lease, carried forward by this process's
clock, so that a relay host whose clock is off still signs with the right time.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


class DatabaseClock:
    """The database's time: this process's clock plus the offset seen at the last lease."""

    def __init__(self) -> None:
        self.offset = 0.0  # the database's clock minus this process's, in seconds

    def observe(self, database_epoch: float, sent: float, received: float) -> None:
        """A statement sent at ``sent`` and answered at ``received`` (this process's
        ``time.time()``) read the database's clock as ``database_epoch``."""
        self.offset = database_epoch - (sent + received) / 2

    def time(self) -> float:
        """Seconds since the epoch, by the database's clock."""
        return time.time() + self.offset

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.time(), UTC)
