"""When the relay should run next, and the wake-up hints that make it run then.

A retry is due 10 s, 20 s, 40 s … after its failure, and a ``Retry-After`` at a time of the
receiver's choosing; without more, only the five-minute sweep would come back for it. So after
a run the relay asks the database when the next Pending message comes due and sends one
wake-up hint that stays invisible until then: an Azure Storage queue takes a visibility timeout
on send, up to seven days (until the retry's nominal time, in fact: a retry is jittered up to a
tenth earlier, and those that failed together are woken together). At most one such hint per
run, and none while a hint this process sent already wakes a run by then: the run it wakes
handles what is due and schedules the next. After a run that set no due time to come, the
answer from before stands for up to a second (``NEXT_DUE_REFRESH_SECONDS``): a drain woken by new
rows does not pay a fourth query for a time it did not change.

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

A NOTIFY fails once PostgreSQL's notification queue is full (a session that LISTENs and stays idle
in a transaction keeps every notification sent since it began), and a producer's failure is only
a warning in the producer's log. So ``serve`` reads the queue's usage every few seconds
(``notify_queue_read``); while it is above ``NOTIFY_QUEUE_ALERT_USAGE`` (core.settings), or for
``NOTIFY_FAILED_POLL_SECONDS`` after a NOTIFY of its own failed, or while its LISTENing connection
is down, the process wants a run every ``FALLBACK_POLL_SECONDS``: it polls, and goes back to
waiting for wake-ups once none holds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from azure.storage.queue.aio import QueueClient

from outbox.core.backoff import JITTER_FRACTION
from outbox.core.errors import DatabaseError
from outbox.core.logs import Throttled
from outbox.core.models import DrainSummary
from outbox.core.resources import Closeable
from outbox.core.settings import NOTIFY_QUEUE_ALERT_USAGE, QueueSettings
from outbox.store.contract import RelayStore
from outbox.transport.covered import clear_covered
from outbox.transport.wakeup import (
    MAX_DELAY_SECONDS,
    NOTIFY_TIMEOUT_SECONDS,
    WakeUpQueue,
    close_queue_client,
    make_queue_client,
    queue_redactor,
)

logger = logging.getLogger("outbox.wakeups")

# After a run that ended on a database error: when to try again.
DATABASE_RETRY_SECONDS = 30
# A hint already due at most this much after the time wanted covers it (it is polled anyway).
COVER_SLACK_SECONDS = 1.0
# While wake-ups cannot be relied on, a run this often: a few seconds' delay instead of the
# sweep's five minutes, for one lease query per poll and process.
FALLBACK_POLL_SECONDS = 3.0
# How long after a NOTIFY of this process failed it keeps polling (the queue's usage, read
# meanwhile, says whether the queue is the cause).
NOTIFY_FAILED_POLL_SECONDS = 60.0
# While the queue stays high, its warning is said again this often.
NOTIFY_QUEUE_LOG_INTERVAL_SECONDS = 60.0
# Hints a caught-up drain covered are looked for at most this often per process (a peek each).
CLEAR_INTERVAL_SECONDS = 1.0
# After a run that set no due time to come (nothing retried, nothing given back), the next due
# time asked before stands, while a run is still wanted by then: it is asked again at most this
# often (another process's retries, an operator's change), or once that time has come.
NEXT_DUE_REFRESH_SECONDS = 1.0


class WakeUps(Closeable):
    """The process's wake-up hints (its queue client, the delayed hints it has sent) and the
    earliest time it wants a run."""

    def __init__(self, settings: QueueSettings, relay_store: RelayStore | None = None) -> None:
        """``relay_store``: where ``OUTBOX_WAKEUP=postgres`` sends its NOTIFY."""
        self._settings = settings
        self._notifier = relay_store if settings.wakes_by_postgres else None
        self._uses_queue = settings.has_queue and not settings.wakes_by_postgres
        self._queue: WakeUpQueue | None = None
        # The same queue as stored (no base64 policy), for clearing covered hints; when last.
        self._raw: QueueClient | None = None
        self._cleared_at = -math.inf
        self._clearing: asyncio.Task[int] | None = None
        self._clear_failed = Throttled(logger, 60.0)
        # When each delayed hint this process sent becomes visible (monotonic), until then.
        self._scheduled: list[float] = []
        # The earliest time (monotonic) this process wants a run, sent or not; and its change.
        self._due: float | None = None
        self.changed = asyncio.Event()
        # Why wake-ups cannot be relied on: the NOTIFY queue's usage is high (and since when its
        # warning was said), or a NOTIFY of this process failed (when, monotonic).
        self._queue_high = False
        self._high_said_at: float | None = None
        self._notify_failed_at: float | None = None
        # serve's LISTENing connection is down (OUTBOX_WAKEUP=postgres): no NOTIFY is heard.
        self._deaf = False
        # When the next due time was last asked (monotonic), and the run its answer wanted
        # (monotonic), or None: no Pending message waits for a time.
        self._next_due_asked: float | None = None
        self._next_due: float | None = None

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

    def polling(self, now: float) -> bool:
        """Whether wake-ups cannot be relied on at ``now`` (monotonic): the NOTIFY queue is above
        the alert, a NOTIFY of this process failed within ``NOTIFY_FAILED_POLL_SECONDS``, or
        its LISTENing connection is down."""
        failed_at = self._notify_failed_at
        return (
            self._queue_high
            or self._deaf
            or (failed_at is not None and now - failed_at < NOTIFY_FAILED_POLL_SECONDS)
        )

    def _poll(self, now: float) -> None:
        """While polling, want a run within ``FALLBACK_POLL_SECONDS`` of ``now``."""
        if self.polling(now):
            self._arm(now + FALLBACK_POLL_SECONDS)

    def notify_queue_read(self, usage: float, now: float) -> None:
        """The NOTIFY queue's usage (0 to 1) as read at ``now`` (monotonic): above the alert, a
        warning at most every ``NOTIFY_QUEUE_LOG_INTERVAL_SECONDS``, and polling until it falls
        back."""
        high = usage > NOTIFY_QUEUE_ALERT_USAGE
        said_at = self._high_said_at
        if high and (said_at is None or now - said_at >= NOTIFY_QUEUE_LOG_INTERVAL_SECONDS):
            logger.warning(
                "wake-ups: PostgreSQL's NOTIFY queue is %.0f%% full (above %.0f%%): a session "
                "that LISTENs and stays idle in a transaction holds it (pg_stat_activity; "
                "PostgreSQL's log names its pid); NOTIFYs fail once it is full: polling every "
                "%g s meanwhile",
                usage * 100,
                NOTIFY_QUEUE_ALERT_USAGE * 100,
                FALLBACK_POLL_SECONDS,
            )
            self._high_said_at = now
        elif not high and self._queue_high:
            logger.info(
                "wake-ups: PostgreSQL's NOTIFY queue is back to %.0f%% full; waiting for "
                "wake-ups again",
                usage * 100,
            )
            self._high_said_at = None
        self._queue_high = high
        self._poll(now)

    def listening(self, heard: bool, now: float) -> None:
        """Whether serve's LISTENing connection is up at ``now`` (monotonic): while it is down,
        polling (a database that answers the pool but not a new LISTEN, or one back before the
        listener's next attempt, is drained within ``FALLBACK_POLL_SECONDS``)."""
        lost, self._deaf = heard is False and not self._deaf, not heard
        if lost:  # then each run that ends asks for the next (a database error: in 30 s)
            self._poll(now)

    def _notify_failed(self, now: float) -> None:
        if not self.polling(now):
            logger.warning(
                "wake-ups: a NOTIFY failed; polling every %g s for %g s",
                FALLBACK_POLL_SECONDS,
                NOTIFY_FAILED_POLL_SECONDS,
            )
        self._notify_failed_at = now
        self._poll(now)

    async def after_run(self, relay_store: RelayStore, summary: DrainSummary) -> None:
        """Wake the next run when it is needed: now, after a database error, when the next
        message comes due, or, while polling, in ``FALLBACK_POLL_SECONDS``."""
        asked = time.monotonic()
        if self._next_due_stands(summary, asked):
            self._poll(asked)
            return
        self._next_due_asked = None  # until answered: this run may have set a time to come
        if summary.stopped_by == "error":
            await self.wake_in(DATABASE_RETRY_SECONDS)
            return
        self._poll(asked)
        if summary.released and summary.stopped_by in ("budget", "stopped"):
            await self.wake_now()
        try:
            due_in = await relay_store.next_due_in()
        except DatabaseError as exc:
            logger.warning("outbox: when the next message comes due is unknown: %s", exc.kind)
            return
        self._next_due_asked = asked
        self._next_due = None
        if due_in is not None:
            # A retry lands up to a tenth before its nominal delay (jitter): waking at the
            # earliest one's nominal time takes those that failed with it in the same run.
            await self.wake_in(due_in / (1 - JITTER_FRACTION))
            self._next_due = self._due  # the run wanted for it (or an earlier one)

    def _next_due_stands(self, summary: DrainSummary, now: float) -> bool:
        """Whether the next due time asked before still holds after ``summary``'s run, at
        ``now`` (monotonic): the run set none to come, it was asked within
        ``NEXT_DUE_REFRESH_SECONDS``, and the run it wanted has not come and is still wanted
        (a run that began just before it takes the timer, maybe without the message)."""
        asked, due = self._next_due_asked, self._next_due
        return (
            summary.stopped_by == "drained"
            and summary.retried == 0
            and summary.released == 0
            and asked is not None
            and now - asked < NEXT_DUE_REFRESH_SECONDS
            and (due is None or (due > now and self._due is not None and self._due <= due))
        )

    async def wake_now(self) -> bool:
        """One hint, visible at once (requeued messages, messages given back): a NOTIFY with
        ``OUTBOX_WAKEUP=postgres``, else a queue message where a queue is configured."""
        self._arm(time.monotonic())
        if self._notifier is not None:
            sent = await self._notifier.notify_wakeup()
            if not sent:
                self._notify_failed(time.monotonic())
            return sent
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

    def clear_covered(self, drained_from: float) -> None:
        """After a drain that began at ``drained_from`` (unix seconds) and ended caught up,
        delete the hints it covered (``outbox.transport.covered``) in the background, at most
        every ``CLEAR_INTERVAL_SECONDS`` and one clearing at a time: the run's caller (an
        invocation) does not wait for it. A failure is a warning, at most one a minute."""
        now = time.monotonic()
        if not self._uses_queue or now - self._cleared_at < CLEAR_INTERVAL_SECONDS:
            return
        if self._clearing is not None and not self._clearing.done():
            return
        self._cleared_at = now
        self._clearing = asyncio.create_task(self._clear(drained_from), name="outbox-clear-hints")

    async def _clear(self, drained_from: float) -> int:
        try:
            if self._raw is None:
                self._raw = make_queue_client(self._settings, encoded=False)
            async with asyncio.timeout(NOTIFY_TIMEOUT_SECONDS):
                return await clear_covered(self._raw, drained_from)
        except Exception as exc:  # noqa: BLE001 - only a cost: the hints wake drains as before
            text = queue_redactor(self._settings)(f"{type(exc).__name__}: {exc}")
            self._clear_failed(f"wake-ups: hints a drain covered not cleared: {text}")
            return 0

    def _queue_client(self) -> WakeUpQueue:
        if self._queue is None:
            self._queue = WakeUpQueue.from_settings(self._settings)
        return self._queue

    async def close(self) -> None:
        clearing = self._clearing
        if clearing is not None and clearing.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({clearing}, timeout=NOTIFY_TIMEOUT_SECONDS)
        if self._queue is not None:
            await self._queue.close()
        if self._raw is not None:
            await close_queue_client(self._raw)
