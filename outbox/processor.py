"""The one processor every trigger and host runs: lease a batch, deliver it, record the outcomes.

``execute()`` drains: it leases batches until nothing is due or its time budget is spent. The next
batch is leased while the current one is still being delivered, so the HTTP slots stay busy.
``OUTBOX_CONCURRENCY`` delivery loops, started once per run, take the leased messages in order
(no task per message). Each batch's outcomes are written in one statement, fenced by the lease
token, and shielded from cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from outbox import store
from outbox.admission import Admission
from outbox.clock import DatabaseClock
from outbox.errors import DatabaseError, describe
from outbox.logs import log_event
from outbox.models import (
    Attempt,
    DeliveryResult,
    DrainSummary,
    LeasedMessage,
    NotAttempted,
    Outcome,
    Recorded,
    Response,
    Status,
    TransportError,
)
from outbox.outcomes import classify
from outbox.redact import Redactor
from outbox.settings import LEASE_SAFETY_SECONDS, Settings
from outbox.stopping import StopRule, stop_rule

logger = logging.getLogger(__name__)
batch_logger = logging.getLogger("outbox.batch")
delivery_logger = logging.getLogger("outbox.delivery")
_OUTCOME_LEVELS = {
    Status.PROCESSED: logging.DEBUG,
    Status.PENDING: logging.WARNING,
    Status.FAILED: logging.ERROR,
}

T = TypeVar("T")

# Batches leased ahead of the one being delivered: one is enough to keep every slot busy.
MAX_BATCHES_IN_FLIGHT = 2
# Batches still open (delivering or writing their outcomes). Outcome writes do not hold up the
# next lease, so a slow commit does not leave the HTTP slots idle; this bounds them.
MAX_BATCHES_OPEN = 2 * MAX_BATCHES_IN_FLIGHT
NOT_SENT = "run interrupted before this message was sent"
# Outcome writes are retried this often (the pool replaces a dropped connection in between).
RECORD_RETRY_DELAYS = (0.2, 1.0, 3.0)
Deliver = Callable[[LeasedMessage], Awaitable[DeliveryResult]]


@dataclass(eq=False)
class _Run:
    """One ``execute()``: its summary, the end of its budget, and the rule that decides its end."""

    summary: DrainSummary
    # Monotonic: no lease and no delivery starts later.
    deadline: float
    rule: StopRule


@dataclass(eq=False)
class _Batch:
    """One leased batch while its messages are delivered by the run's delivery loops."""

    messages: list[LeasedMessage]
    lease_deadline: float
    run: _Run
    # Resolved when every message has an attempt (or the batch is abandoned on cancellation).
    delivered: asyncio.Future[None]
    # Per message: its attempt, the exception that escaped it, or None (not finished).
    attempts: list[Attempt | BaseException | None] = field(init=False)
    # Per message: when its request started (wall clock, monotonic), or None (not started).
    started: list[tuple[datetime, float] | None] = field(init=False)
    remaining: int = field(init=False)
    # Per message: whether it still waits for a delivery slot (counted by the admission).
    queued: list[bool] = field(init=False)
    # Set once its outcomes are being written: a message not yet started is not sent any more.
    closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.attempts = [None] * len(self.messages)
        self.started = [None] * len(self.messages)
        self.remaining = len(self.messages)
        self.queued = [True] * len(self.messages)

    def settle(self, index: int, attempt: Attempt | BaseException | None) -> None:
        if attempt is not None:
            self.attempts[index] = attempt
        self.remaining -= 1
        if self.remaining == 0 and not self.delivered.done():
            self.delivered.set_result(None)


# A message waiting for a delivery loop: its batch and its index there.
_Work = tuple[_Batch, int]


class OutboxProcessor:
    """Drains the outbox: shared by the queue, timer and HTTP triggers (and ``outbox serve``)."""

    def __init__(
        self,
        pool: store.Connection,
        deliver: Deliver,
        settings: Settings,
        *,
        redact: Redactor | None = None,
        clock: DatabaseClock | None = None,
    ) -> None:
        self._pool = pool
        self._deliver = deliver
        self._settings = settings
        # Set at each lease, read by the publisher (webhook-timestamp) and for Retry-After dates.
        self.clock = clock or DatabaseClock()
        self._redact = redact or Redactor.from_settings(settings)
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._admission = Admission(settings.concurrency)
        self._hold = settings.ordering_on_failure == "hold"
        self._stopping = False

    def stop(self) -> None:
        """Make running drains finish what is in flight, release the rest, and return."""
        self._stopping = True

    async def execute(
        self, budget_seconds: float | None = None, *, until_caught_up: bool = False
    ) -> DrainSummary:
        """Deliver due messages until none is due, the budget is spent, or ``stop()`` is called.

        ``until_caught_up`` (a wake-up hint's run): end once a lease comes back short and its
        deliveries are done, unless what it recorded is due again already; otherwise (a drain)
        lease until a lease finds nothing, having first let go what a change outside the relay
        left parked. ``outbox.stopping`` holds both rules.

        Database errors (unreachable, connection lost, schema missing) end the run early; they
        are reported in ``summary.error`` rather than raised, and whatever was leased stays safe
        under its lease.
        """
        summary = DrainSummary()
        started = time.monotonic()
        budget = min(budget_seconds or self._settings.run_budget_seconds, 3600.0)
        run = _Run(summary, started + budget, stop_rule(until_caught_up=until_caught_up))
        batches: set[asyncio.Task[None]] = set()
        work: asyncio.Queue[_Work] = asyncio.Queue()
        loops = [
            asyncio.create_task(self._deliver_loop(work)) for _ in range(self._settings.concurrency)
        ]
        try:
            if run.rule.sweeps:
                await store.release_held(self._pool, hold_on_failure=self._hold)
            await self._drain(run, batches, work)
        except DatabaseError as exc:
            self._report_database_error(summary, exc)
        except asyncio.CancelledError:
            # Interrupt the deliveries; each batch still records what it has (shielded).
            for task in (*batches, *loops):
                task.cancel()
            raise
        finally:
            try:
                await self._finish(batches)
            finally:
                # Also when cancelled while the last batches finish: no loop outlives the run.
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
                summary.duration_seconds = time.monotonic() - started
        return summary

    async def _drain(
        self, run: _Run, batches: set[asyncio.Task[None]], work: asyncio.Queue[_Work]
    ) -> None:
        summary = run.summary
        # Batches whose deliveries are still running; each is resolved before its outcome write.
        delivering: set[asyncio.Future[None]] = set()
        loop = asyncio.get_running_loop()
        while True:
            if summary.error:
                return  # an outcome write failed for good: leasing more would only strand rows
            if self._stopping:
                summary.stopped_by = "stopped"
                return
            if time.monotonic() >= run.deadline:
                summary.stopped_by = "budget"
                return
            size = await self._lease_size(run, delivering, batches)
            if not size:
                continue  # it waited for room: everything above may have changed
            lease_deadline = time.monotonic() + self._settings.lease_seconds
            lease = await self._lease(size)
            if lease.messages:
                batch = _Batch(lease.messages, lease_deadline, run, loop.create_future())
                self._start(batch, work, delivering, batches)
            if lease.taken < size:
                if not lease.taken and not batches:
                    return
                # Caught up: let the in-flight batches finish (their retries may come due),
                # then the run's rule says whether to lease once more.
                await self._finish(batches)
                if run.rule.caught_up():
                    return

    async def _lease_size(
        self, run: _Run, delivering: set[asyncio.Future[None]], batches: set[asyncio.Task[None]]
    ) -> int:
        """How many messages the run leases now; 0 after it waited while it, or the whole
        process, had as much leased as can be delivered soon."""
        if len(delivering) >= MAX_BATCHES_IN_FLIGHT or len(batches) >= MAX_BATCHES_OPEN:
            busy = delivering if len(delivering) >= MAX_BATCHES_IN_FLIGHT else batches
            await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
            return 0
        window = self._start_window(run, time.monotonic())
        size = self._admission.room(window, self._settings.batch_size)
        if not size:
            await self._admission.wait(run.deadline)
        return size

    async def _lease(self, size: int) -> store.Lease:
        """Lease up to ``size`` messages, counted as waiting from before the statement is sent."""
        self._admission.reserve(size)
        leased = 0
        sent = time.time()
        try:
            lease = await store.lease_batch(
                self._pool,
                size,
                self._settings.lease_seconds,
                hold_on_failure=self._hold,
                max_payload_bytes=self._settings.max_payload_bytes,
            )
            leased = len(lease.messages)
            if lease.database_now is not None:
                self.clock.observe(lease.database_now, sent, time.time())
            return lease
        finally:
            self._admission.release(size - leased)

    def _start_window(self, run: _Run, now: float) -> float:
        """Seconds from ``now`` within which a message leased now must start to be sent."""
        last_start = self._settings.lease_seconds - (
            self._settings.http_timeout_seconds + LEASE_SAFETY_SECONDS
        )
        return min(run.deadline - now, last_start)

    def _start(
        self,
        batch: _Batch,
        work: asyncio.Queue[_Work],
        delivering: set[asyncio.Future[None]],
        batches: set[asyncio.Task[None]],
    ) -> None:
        """Hand a leased batch's messages to the delivery loops; a task records its outcomes."""
        batch.run.summary.leased += len(batch.messages)
        batch.run.summary.batches += 1
        delivering.add(batch.delivered)
        batch.delivered.add_done_callback(delivering.discard)
        for index in range(len(batch.messages)):
            work.put_nowait((batch, index))
        task = asyncio.create_task(self._run_batch(batch))
        batches.add(task)
        task.add_done_callback(batches.discard)

    async def _deliver_loop(self, work: asyncio.Queue[_Work]) -> None:
        """One of the run's delivery loops: leased messages one at a time, in lease order."""
        while True:
            batch, index = await work.get()
            attempt: Attempt | BaseException | None = None
            try:
                attempt = await self._attempt(batch, index)
            except Exception as exc:  # noqa: BLE001 - unexpected: becomes this message's outcome
                attempt = exc
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the run is being cancelled: stop this loop
                attempt = exc  # raised by the delivery itself: that message's outcome only
            finally:
                # Also on cancellation (attempt None): the batch records it as interrupted if it
                # was sent, or releases it if it was not.
                batch.settle(index, attempt)

    async def _run_batch(self, batch: _Batch) -> None:
        try:
            await asyncio.shield(batch.delivered)
        finally:
            # The drain may lease the next batch while this one writes its outcomes.
            if not batch.delivered.done():
                batch.delivered.set_result(None)
            # Also on cancellation: whatever finished is recorded, whatever was sent and did not
            # finish is retried, whatever was not sent is released (and will not be sent now).
            batch.closed = True
            for index in range(len(batch.messages)):
                self._leave(batch, index)
            now = self.clock.now()  # a Retry-After date is the receiver's idea of this time
            records = [self._outcome(batch, index, now) for index in range(len(batch.messages))]
            await shielded(self._record(records, batch.run))

    async def _attempt(self, batch: _Batch, index: int) -> Attempt:
        # Asked before waiting for a slot too: the slots are shared with the process's other
        # runs, and a message this run will not send must not wait behind their requests.
        if reason := self._not_sent_because(batch, time.monotonic()):
            self._leave(batch, index)
            return Attempt(NotAttempted(reason), datetime.now(UTC), 0)
        async with self._slots:
            self._leave(batch, index)
            now = datetime.now(UTC)
            started = time.monotonic()
            if reason := self._not_sent_because(batch, started):
                return Attempt(NotAttempted(reason), now, 0)
            batch.started[index] = (now, started)
            result = await self._deliver(batch.messages[index])
            took = time.monotonic() - started
            self._admission.finished(took)
            return Attempt(result, now, round(took * 1000))

    def _leave(self, batch: _Batch, index: int) -> None:
        """The message no longer waits for a slot (it starts, or it will not be sent now)."""
        if batch.queued[index]:
            batch.queued[index] = False
            self._admission.release()

    def _not_sent_because(self, batch: _Batch, at: float) -> str | None:
        """Why a message of ``batch`` must not be sent at ``at`` (monotonic), if it must not."""
        if self._stopping:
            return "relay stopping"
        if batch.closed:
            return NOT_SENT
        if at >= batch.run.deadline:
            # A run ends at most one HTTP timeout after its budget, whatever the lease.
            return "run budget spent"
        if batch.lease_deadline - at < self._settings.http_timeout_seconds + LEASE_SAFETY_SECONDS:
            return "lease too short to finish a delivery"
        return None

    def _outcome(self, batch: _Batch, index: int, now: datetime) -> Recorded:
        message, attempt = batch.messages[index], batch.attempts[index]
        if not isinstance(attempt, Attempt):
            attempt = self._broken_attempt(attempt, batch.started[index], now)
        try:
            outcome = self._classify(attempt, message, now)
        except Exception as exc:  # noqa: BLE001 - an answer nobody foresaw must not cost the batch
            attempt = replace(attempt, result=self._unexpected(exc))
            outcome = self._classify(attempt, message, now)
        return Recorded(message, outcome, attempt)

    def _classify(self, attempt: Attempt, message: LeasedMessage, now: datetime) -> Outcome:
        return classify(
            attempt.result,
            attempt=message.attempt,
            max_attempts=self._settings.max_attempts,
            now=now,
        )

    def _unexpected(self, error: BaseException) -> TransportError:
        """An exception as a retryable result, its text redacted."""
        name = type(error).__name__
        return TransportError(self._redact(f"unexpected {name}: {error}"), name)

    def _broken_attempt(
        self, error: BaseException | None, started: tuple[datetime, float] | None, now: datetime
    ) -> Attempt:
        """An attempt that did not return: never sent, interrupted, or failed unexpectedly."""
        if error is not None:
            result: DeliveryResult = self._unexpected(error)
        elif started is None:
            # Never sent (the run was cancelled first): given back as it was, not counted.
            return Attempt(NotAttempted(NOT_SENT), now, 0)
        else:
            # The request may have reached the receiver: count the attempt and retry later.
            result = TransportError("delivery interrupted before it completed", "Interrupted")
        if started is None:
            return Attempt(result, now, 0)
        return Attempt(result, started[0], round((time.monotonic() - started[1]) * 1000))

    async def _record(self, records: list[Recorded], run: _Run) -> None:
        summary = run.summary
        tries = 0

        async def write() -> store.Written:
            nonlocal tries
            tries += 1
            # A retry may follow a write that committed before its connection was lost.
            return await store.record_outcomes(
                self._pool, records, hold_on_failure=self._hold, retrying=tries > 1
            )

        try:
            written = await retry_database(write)
        except DatabaseError as exc:
            # The rows stay Processing; once their lease expires they are delivered again.
            summary.unrecorded += len(records)
            self._report_database_error(summary, exc)
            return
        except Exception as exc:  # noqa: BLE001 - a bug: in the summary, not only in a log line
            summary.unrecorded += len(records)
            self._report_error(summary, f"outcome write failed: {describe(exc)}")
            return
        run.rule.recorded(records, written.lets_next_go)
        batch = DrainSummary(leased=len(records))
        for record in records:
            applied = record.message.message_id in written.applied
            log_outcome(record, applied=applied)
            for counts in (summary, batch):
                if applied:
                    counts.count(record.outcome)
                else:
                    counts.stale += 1
        log_event(
            batch_logger,
            logging.INFO,
            "outbox.batch",
            leased=batch.leased,
            processed=batch.processed,
            retried=batch.retried,
            failed=batch.failed,
            released=batch.released,
            stale=batch.stale,
        )

    async def _finish(self, tasks: set[asyncio.Task[None]]) -> None:
        """Wait for every task in ``tasks``; their own errors are logged (redacted), not raised."""
        while tasks:
            snapshot = list(tasks)
            results = await asyncio.gather(*snapshot, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    text = self._redact(describe(result))
                    logger.error("outbox batch failed: %s", text)
            tasks.difference_update(snapshot)

    def _report_database_error(self, summary: DrainSummary, exc: DatabaseError) -> None:
        self._report_error(summary, f"database error: {exc}")

    def _report_error(self, summary: DrainSummary, text: str) -> None:
        summary.stopped_by = "error"
        summary.error = self._redact(text)
        logger.error("outbox drain: %s", summary.error)


def log_outcome(record: Recorded, *, applied: bool) -> None:
    """One line per outcome: DEBUG when delivered, WARNING when retried, ERROR when failed."""
    outcome, attempt = record.outcome, record.attempt
    if not applied:
        level, label = logging.WARNING, "Stale"
    elif outcome.not_attempted:
        # One line per run says how many were given back (its summary's released).
        level, label = logging.DEBUG, "Released"
    else:
        level, label = _OUTCOME_LEVELS[outcome.status], str(outcome.status)
    if not delivery_logger.isEnabledFor(level):
        return  # most runs: DEBUG (delivered) is off; skip building the fields
    result = attempt.result
    log_event(
        delivery_logger,
        level,
        "outbox.delivery",
        message_id=record.message.message_id,
        event_type=record.message.event_type,
        attempt=record.message.attempt,
        outcome=label,
        http_status=result.status if isinstance(result, Response) else None,
        duration_ms=attempt.duration_ms,
        retry_in_s=round(outcome.delay_seconds, 1) if label == "Pending" else None,
        error=outcome.error,
    )


async def retry_database(operation: Callable[[], Awaitable[T]]) -> T:
    """Run ``operation``, retrying after transient database errors (a new connection may work)."""
    for delay in RECORD_RETRY_DELAYS:
        try:
            return await operation()
        except DatabaseError as exc:
            if not exc.transient:
                raise
            logger.warning("database write failed (%s); retrying in %.1fs", exc.kind, delay)
            await asyncio.sleep(delay)
    return await operation()


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` to completion even if the caller is cancelled, then re-raise the cancellation.

    Used for outcome writes: a cancelled invocation must not lose a status update.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result
