"""Record: a finished batch's outcomes written in one statement, retried after database errors.

The write is fenced by each row's lease token (``RelayStore.record_outcomes``), shielded from
cancellation (``shielded``: a cancelled invocation must not lose a status update) and retried on
transient database errors, each retry asking whether the lost write committed after all. It
runs beside the next batch's deliveries and lease.

Fast paths (docs/performance.md):
- ``_record_sent``: the usual batch, each message answered 2xx by every endpoint with nothing
  kept from before, is written by the leaner statement (``RelayStore.record_delivered``, two
  arrays per message and six per attempt: § "The lean outcome write") and builds no outcome
  objects unless DEBUG logs them ("a batch all delivered written by `record_delivered`, no
  outcome objects built", § "The relay's own CPU").
- ``log_outcome`` skips building a line's fields when its level is off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from outbox.core.clock import DatabaseClock
from outbox.core.errors import DatabaseError, describe
from outbox.core.logs import log_event, trace_fields
from outbox.core.models import Attempt, DrainSummary, Recorded, Response, Status
from outbox.core.redact import Redactor
from outbox.relay.batch import Batch, Run, endpoint_name
from outbox.relay.breaker_store import BreakerWriter
from outbox.relay.classify import Classifier
from outbox.store.contract import RelayStore, SentAttempt, Written

logger = logging.getLogger("outbox.processor")
batch_logger = logging.getLogger("outbox.batch")
delivery_logger = logging.getLogger("outbox.delivery")
_OUTCOME_LEVELS = {
    Status.PROCESSED: logging.DEBUG,
    Status.PENDING: logging.WARNING,
    Status.FAILED: logging.ERROR,
}

T = TypeVar("T")

# Outcome writes are retried this often (the pool replaces a dropped connection in between).
RECORD_RETRY_DELAYS = (0.2, 1.0, 3.0)


class Recorder:
    """Writes each finished batch's outcomes and counts them in its run's summary."""

    def __init__(
        self,
        relay_store: RelayStore,
        *,
        hold_on_failure: bool,
        clock: DatabaseClock,
        classifier: Classifier,
        breakers: BreakerWriter,
        redact: Redactor,
    ) -> None:
        self._store = relay_store
        self._hold = hold_on_failure
        self._clock = clock
        self._classifier = classifier
        self._breakers = breakers
        self._redact = redact

    async def record(self, batch: Batch) -> None:
        """Write a finished batch's outcomes; the usual batch (all delivered) in the lean way."""
        await self._breakers.flush()
        if (sent := _all_sent(batch)) is not None:
            await self._record_sent(batch, sent)
            return
        now = self._clock.now()  # a Retry-After date is the receiver's idea of this time
        outcome = self._classifier.outcome
        records = [outcome(batch, index, now) for index in range(len(batch.messages))]
        await self._record(records, batch.run)

    async def _record(self, records: list[Recorded], run: Run) -> None:
        def write(retrying: bool) -> Awaitable[Written]:
            return self._store.record_outcomes(
                records, hold_on_failure=self._hold, retrying=retrying
            )

        written = await self._write(write, len(records), run.summary)
        if written is None:
            return
        run.rule.recorded(records, written.lets_next_go)
        batch = DrainSummary(leased=len(records))
        for record in records:
            applied = record.message.message_id in written.applied
            log_outcome(record, applied=applied)
            for counts in (run.summary, batch):
                if applied:
                    counts.count(record.outcome)
                else:
                    counts.stale += 1
        _log_batch(batch)

    async def _record_sent(self, batch: Batch, sent: list[SentAttempt]) -> None:
        """Record a batch whose every message was delivered (``_all_sent``)."""
        messages = batch.messages

        def write(retrying: bool) -> Awaitable[Written]:
            return self._store.record_delivered(
                messages, sent, hold_on_failure=self._hold, retrying=retrying
            )

        summary = batch.run.summary
        written = await self._write(write, len(messages), summary)
        if written is None:
            return
        batch.run.rule.recorded((), written.lets_next_go)
        stale = len(messages) - len(written.applied)
        if stale or delivery_logger.isEnabledFor(logging.DEBUG):
            now = self._clock.now()
            for index, message in enumerate(messages):
                applied = message.message_id in written.applied
                log_outcome(self._classifier.outcome(batch, index, now), applied=applied)
        summary.processed += len(messages) - stale
        summary.stale += stale
        _log_batch(DrainSummary(leased=len(messages), processed=len(messages) - stale, stale=stale))

    async def _write(
        self, write: Callable[[bool], Awaitable[Written]], count: int, summary: DrainSummary
    ) -> Written | None:
        """Run an outcome ``write`` (given whether it repeats one whose reply was lost), retried
        after transient errors; None when it failed for good: the run's error says why."""
        tries = 0

        async def attempt() -> Written:
            nonlocal tries
            tries += 1
            # A retry may follow a write that committed before its connection was lost.
            return await write(tries > 1)

        try:
            return await retry_database(attempt)
        except DatabaseError as exc:
            # The rows stay Processing; once their lease expires they are delivered again.
            summary.unrecorded += count
            report_error(summary, f"database error: {exc}", self._redact)
        except Exception as exc:  # noqa: BLE001 - a bug: in the summary, not only in a log line
            summary.unrecorded += count
            report_error(summary, f"outcome write failed: {describe(exc)}", self._redact)
        return None


def report_error(summary: DrainSummary, text: str, redact: Redactor) -> None:
    """End the run on an error: in its summary (redacted), and in one log line."""
    summary.stopped_by = "error"
    summary.error = redact(text)
    logger.error("outbox drain: %s", summary.error)


def _all_sent(batch: Batch) -> list[SentAttempt] | None:
    """The batch's attempts, if each message was answered 2xx (no text kept) by every endpoint of
    its event type with nothing kept from before (all Processed: ``RelayStore.record_delivered``);
    else None."""
    sent: list[SentAttempt] = []
    for message, planned in zip(batch.messages, batch.deliveries, strict=True):
        if message.endpoint_state is not None or not isinstance(planned, list):
            return None
        for delivery in planned:
            attempt = delivery.attempt
            if not isinstance(attempt, Attempt):
                return None
            result = attempt.result
            if not isinstance(result, Response) or not 200 <= result.status < 300 or result.snippet:
                return None  # (a snippet: kept by the general statement only)
            sent.append(
                SentAttempt(
                    message.message_id,
                    endpoint_name(delivery.endpoint),
                    delivery.number,
                    attempt.started_epoch,
                    attempt.duration_ms,
                    result.status,
                )
            )
    return sent


def _log_batch(batch: DrainSummary) -> None:
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


def log_outcome(record: Recorded, *, applied: bool) -> None:
    """One line per delivery: DEBUG when delivered, WARNING when retried, ERROR when failed."""
    for delivered in record.deliveries:
        outcome, attempt = delivered.outcome, delivered.attempt
        if not applied:
            level, label = logging.WARNING, "Stale"
        elif outcome.not_attempted:
            # One line per run says how many were given back (its summary's released).
            level, label = logging.DEBUG, "Released"
        else:
            level, label = _OUTCOME_LEVELS[outcome.status], str(outcome.status)
        if not delivery_logger.isEnabledFor(level):
            continue  # most runs: DEBUG (delivered) is off; skip building the fields
        result = attempt.result
        log_event(
            delivery_logger,
            level,
            "outbox.delivery",
            message_id=record.message.message_id,
            event_type=record.message.event_type,
            endpoint=delivered.endpoint,
            attempt=delivered.number,
            outcome=label,
            http_status=result.status if isinstance(result, Response) else None,
            duration_ms=attempt.duration_ms,
            retry_in_s=round(outcome.delay_seconds, 1) if label == "Pending" else None,
            error=outcome.error,
            **trace_fields(attempt.trace),
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
