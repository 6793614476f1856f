"""When the relay should run next, and the wake-up hints that make it run then.

A retry is due 10 s, 20 s, 40 s … after its failure, and a ``Retry-After`` at a time of the
receiver's choosing; without more, only the five-minute sweep would come back for it. So after
each run the relay asks the database when the next Pending message comes due and sends one
wake-up hint that stays invisible until then: an Azure Storage queue takes a visibility timeout
on send, up to seven days (until the retry's nominal time, in fact: a retry is jittered up to a
tenth earlier, and those that failed together are woken together). At most one such hint per
run, and none while a hint this process sent already wakes a run by then: the run it wakes
handles what is due and schedules the next.

After a run that gave messages back at its end (its budget spent, the relay stopping) one hint
is sent at once, so that another drain takes them; after a run that ended on a database error,
one in 30 s, so that a database that comes back is drained within a minute. A hint that cannot
be sent is a warning, never the run's error: the sweep still finds the row, and a host that
lives on (``outbox serve``) drains on its own timer anyway. Where no queue is configured nothing
is sent.

Whatever is sent, the process keeps the earliest time it wanted a run (``due_in``, ``take_due``,
``changed``): ``outbox serve`` arms its own timer on it and drains then, so a retry is on time
with no queue at all, or one that cannot be reached. A run that starts covers what was due by
then: the timer and a hint that wake together make one run that finds work, not two.

With ``OUTBOX_WAKEUP=postgres`` a hint due now is a ``NOTIFY`` on the database (which every
``serve`` LISTENs to); one due later has no carrier but each process's own timer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from outbox import store
from outbox.core.backoff import JITTER_FRACTION
from outbox.core.errors import DatabaseError
from outbox.core.models import DrainSummary
from outbox.core.resources import Closeable
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import MAX_DELAY_SECONDS, WakeUpQueue

logger = logging.getLogger("outbox.wakeups")

# After a run that ended on a database error: when to try again.
DATABASE_RETRY_SECONDS = 30
# A hint already due at most this much after the time wanted covers it (it is polled anyway).
COVER_SLACK_SECONDS = 1.0


class WakeUps(Closeable):
    """The process's wake-up hints (its queue client, the delayed hints it has sent) and the
    earliest time it wants a run."""

    def __init__(
        self, settings: QueueSettings, relay_store: store.RelayStore | None = None
    ) -> None:
        """``relay_store``: where ``OUTBOX_WAKEUP=postgres`` sends its NOTIFY."""
        self._settings = settings
        self._notifier = relay_store if settings.wakes_by_postgres else None
        self._uses_queue = settings.has_queue and not settings.wakes_by_postgres
        self._queue: WakeUpQueue | None = None
        # When each delayed hint this process sent becomes visible (monotonic), until then.
        self._scheduled: list[float] = []
        # The earliest time (monotonic) this process wants a run, sent or not; and its change.
        self._due: float | None = None
        self.changed = asyncio.Event()

    def run_starting(self, now: float) -> None:
        """A run starts at ``now`` (monotonic): it takes what was due by then."""
        if self._due is not None and self._due <= now + COVER_SLACK_SECONDS:
            self._due = None

    def due_in(self, now: float) -> float | None:
        """Seconds from ``now`` (monotonic) until this process wants a run; None: no time."""
        return None if self._due is None else max(self._due - now, 0.0)

    def take_due(self, now: float) -> bool:
        """Whether a run is wanted by ``now`` (monotonic); forgotten once told (the run it
        stands for schedules the next)."""
        if self._due is None or self._due > now:
            return False
        self._due = None
        return True

    def _arm(self, at: float) -> None:
        if self._due is None or at < self._due:
            self._due = at
            self.changed.set()

    async def after_run(self, relay_store: store.RelayStore, summary: DrainSummary) -> None:
        """Wake the next run when it is needed: now, after a database error, or when the next
        message comes due."""
        if summary.stopped_by == "error":
            await self.wake_in(DATABASE_RETRY_SECONDS)
            return
        if summary.released and summary.stopped_by in ("budget", "stopped"):
            await self.wake_now()
        try:
            due_in = await relay_store.next_due_in()
        except DatabaseError as exc:
            logger.warning("outbox: when the next message comes due is unknown: %s", exc.kind)
            return
        if due_in is not None:
            # A retry lands up to a tenth before its nominal delay (jitter): waking at the
            # earliest one's nominal time takes those that failed with it in the same run.
            await self.wake_in(due_in / (1 - JITTER_FRACTION))

    async def wake_now(self) -> bool:
        """One hint, visible at once (requeued messages, messages given back): a NOTIFY with
        ``OUTBOX_WAKEUP=postgres``, else a queue message where a queue is configured."""
        self._arm(time.monotonic())
        if self._notifier is not None:
            return await self._notifier.notify_wakeup()
        return await self._queue_client().notify() if self._uses_queue else False

    async def wake_in(self, seconds: float) -> bool:
        """One hint visible in ``seconds`` (rounded up to whole seconds, at least one), unless
        a hint this process sent is visible by then already. Whether one was sent."""
        delay = min(max(math.ceil(seconds), 1), MAX_DELAY_SECONDS)
        now = time.monotonic()
        self._arm(now + delay)
        if not self._uses_queue:
            return False
        self._scheduled = [at for at in self._scheduled if at > now]
        if any(at <= now + delay + COVER_SLACK_SECONDS for at in self._scheduled):
            return False
        sent = await self._queue_client().notify(delay_seconds=delay)
        if sent:
            self._scheduled.append(now + delay)
        return sent

    def _queue_client(self) -> WakeUpQueue:
        if self._queue is None:
            self._queue = WakeUpQueue.from_settings(self._settings)
        return self._queue

    async def close(self) -> None:
        if self._queue is not None:
            await self._queue.close()
