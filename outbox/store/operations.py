"""Day-two operations over the outbox: backlog health, replay of Failed rows, retention, inspection.

Shared by the CLI (``python -m outbox status | requeue | purge | show``) and the HTTP endpoints;
``purge_inbox`` is the consumer inbox's retention (``python -m outbox purge --inbox``).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from outbox.core import requests
from outbox.core.models import Status
from outbox.core.requests import RequeueFilter
from outbox.core.telemetry import Backlog, Telemetry, process_telemetry
from outbox.store import partitions
from outbox.store import postgres as store

MAX_LISTED_IDS = 1000
# How show says a payload is given as the database's text, before why.
UNREADABLE = "payload shown as the database's text, not decoded"
# A host clock further off the database's than this is reported by status.
MAX_CLOCK_OFFSET_SECONDS = 60.0
# PostgreSQL's NOTIFY queue in use above this fraction is reported by status, and makes
# ``outbox serve`` poll (OUTBOX_WAKEUP=postgres). PostgreSQL warns in its own log from the same
# point; a healthy queue holds only what listeners have not read yet (a few pages of 8 KB, under
# 0.1 % of the default 8 GB), and half of it left is room to act before NOTIFY fails.
NOTIFY_QUEUE_ALERT_USAGE = 0.5


@dataclass(slots=True)
class BacklogStatus:
    """What ``status`` reports. ``healthy`` is false when a message waits longer than allowed."""

    counts: dict[str, int]
    oldest_due_pending_age_seconds: float | None
    oldest_unpublished_age_seconds: float | None
    oldest_failed_age_seconds: float | None
    expired_leases: int
    # Pending messages parked behind an earlier message of their ordering key.
    held_back: int
    # This host's clock minus the database's, in seconds.
    clock_offset_seconds: float
    # Endpoints whose circuit breaker holds deliveries back: "open" (cooling down until
    # next_probe) or "half-open" (next_probe has passed and a message waits: its next delivery
    # is the probe), since when, failures in a row. One past its cool-down with nothing waiting
    # holds nothing back and is not listed.
    open_breakers: list[dict[str, Any]]
    # Endpoints paused by an operator (console, `python -m outbox pause`): since when, by whom.
    paused_endpoints: list[dict[str, Any]]
    alert_threshold_seconds: float
    # The fraction of PostgreSQL's NOTIFY queue in use (the OUTBOX_WAKEUP=postgres wake-ups').
    notify_queue_usage: float
    healthy: bool
    problems: list[str] = field(default_factory=list)
    # Statuses whose count is an estimate (the console's overview, over many Processed rows).
    estimated_counts: list[str] = field(default_factory=list)
    # "plain", or the partitioned layout's partitions (partitions.describe).
    layout: dict[str, Any] = field(default_factory=lambda: {"layout": "plain"})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def backlog_status(
    conn: store.Connection,
    threshold_seconds: float,
    *,
    telemetry: Telemetry | None = None,
    processed_up_to: int | None = None,
    notify_wakeups: bool = False,
) -> BacklogStatus:
    """The backlog's health against ``OUTBOX_ALERT_OLDEST_PENDING_SECONDS``.

    The alert is the one the outbox guide asks for: the age of the oldest unpublished row
    (Pending or Processing, due or backing off). Failed rows are counted, not alerted on: with
    ordering keys held by a Failed row, the rows held back age and trip the alert anyway.

    Its figures also feed the backlog gauges of ``telemetry`` (by default the process's).
    With ``processed_up_to``, Processed rows are counted up to that many, beyond which their
    count is estimated from the table's row estimate and listed in ``estimated_counts``.
    """
    sent = time.time()
    row = await store.backlog_status(conn, processed_up_to)
    breakers = await store.open_breakers(conn)
    paused = await store.paused_endpoints(conn)
    notify_usage = await store.notify_queue_usage(conn)
    offset = (sent + time.time()) / 2 - row["database_now"]
    oldest = row["oldest_unpublished_age_seconds"]
    problems = []
    if oldest is not None and oldest > threshold_seconds:
        problems.append(
            f"oldest unpublished message is {oldest:.0f}s old "
            f"(threshold {threshold_seconds:g}s): is the relay running, is a receiver failing?"
        )
    if abs(offset) > MAX_CLOCK_OFFSET_SECONDS:
        problems.append(
            f"this host's clock is {abs(offset):.0f}s {'ahead of' if offset > 0 else 'behind'} "
            "the database's: signatures carry the database's time, but check the host's time "
            "synchronisation (NTP)"
        )
    # A full queue is the relay's problem where its wake-ups are NOTIFYs (OUTBOX_WAKEUP=postgres);
    # elsewhere it is reported as a figure only, not as the backlog's ill health.
    if notify_wakeups and (notify_problem := notify_queue_problem(notify_usage)) is not None:
        problems.append(notify_problem)
    layout: dict[str, Any] = {"layout": "plain"}
    if row["partitioned"]:
        async with store.acquired(conn) as connection:
            layout = await partitions.describe(connection)
    problems.extend(partitions.layout_problems(layout))
    counts = {str(s): row[str(s).lower()] for s in Status}
    estimated = []
    if processed_up_to is not None and counts["Processed"] >= processed_up_to:
        others = counts["Pending"] + counts["Processing"] + counts["Failed"]
        counts["Processed"] = max(processed_up_to, (row["estimated_rows"] or 0) - others)
        estimated.append("Processed")
    observed = telemetry or process_telemetry()
    observed.record_backlog(Backlog(counts, oldest, len(breakers)))
    observed.record_notify_queue_usage(notify_usage)
    return BacklogStatus(
        counts=counts,
        oldest_due_pending_age_seconds=_rounded(row["oldest_due_pending_age_seconds"]),
        oldest_unpublished_age_seconds=_rounded(oldest),
        oldest_failed_age_seconds=_rounded(row["oldest_failed_age_seconds"]),
        expired_leases=row["expired_leases"],
        held_back=row["held_back"],
        clock_offset_seconds=round(offset, 1),
        open_breakers=[
            {
                "event_type": b["event_type"],
                "endpoint": b["endpoint"],
                "state": b["state"],
                "since": _iso(b["opened_at"]),
                "next_probe": _iso(b["reopen_at"]),
                "probing": bool(b["probing"]),
                "consecutive_failures": b["consecutive_failures"],
            }
            for b in breakers
        ],
        paused_endpoints=[
            {
                "event_type": p["event_type"],
                "endpoint": p["endpoint"],
                "since": _iso(p["paused_at"]),
                "by": p["paused_by"],
            }
            for p in paused
        ],
        alert_threshold_seconds=threshold_seconds,
        notify_queue_usage=round(notify_usage, 4),
        estimated_counts=estimated,
        layout=layout,
        healthy=not problems,
        problems=problems,
    )


def notify_queue_problem(usage: float) -> str | None:
    """What status says of PostgreSQL's NOTIFY queue at ``usage`` (0 to 1): None up to
    ``NOTIFY_QUEUE_ALERT_USAGE``."""
    if usage <= NOTIFY_QUEUE_ALERT_USAGE:
        return None
    return (
        f"PostgreSQL's NOTIFY queue is {usage:.0%} full (threshold "
        f"{NOTIFY_QUEUE_ALERT_USAGE:.0%}): a session that LISTENs and stays idle in a transaction "
        "holds it (pg_stat_activity; PostgreSQL's log names its pid). Once full, every NOTIFY "
        "fails: OUTBOX_WAKEUP=postgres wake-ups are lost and serve polls every few seconds"
    )


@dataclass(slots=True)
class RequeueReport:
    requeued: int
    dry_run: bool
    message_ids: list[str]  # at most MAX_LISTED_IDS of them
    endpoints: list[str] | None = None  # a dry run's: where they would be sent again

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def requeue(conn: store.Connection, wanted: RequeueFilter, *, dry_run: bool) -> RequeueReport:
    """Set matching Failed rows back to Pending, due now, with a fresh attempt budget.

    Their attempt history and last_error stay; a dry run only reports what would change.
    """
    wanted = requests.parse(requests.RequeueRequest, asdict(wanted) | {"dry_run": dry_run}).filter
    found = await store.requeue_failed(
        conn,
        wanted.message_ids,
        wanted.event_type,
        wanted.created_from,
        wanted.created_to,
        dry_run=dry_run,
        listed=MAX_LISTED_IDS,
        endpoint=wanted.endpoint,
        error=wanted.error,
    )
    return RequeueReport(found.total, dry_run, [str(i) for i in found.first_ids], found.endpoints)


@dataclass(slots=True)
class PurgeReport:
    processed_deleted: int = 0
    failed_deleted: int = 0
    batches: int = 0
    # The partitioned layout's (docs/partitioning.md): what was made, dropped, moved and kept.
    layout: str = "plain"
    partitions: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The plain layout's report as it always was; the partitioned one's adds its own."""
        report = asdict(self)
        if self.partitions is None:
            del report["layout"], report["partitions"]
        return report


async def purge(
    conn: store.Connection,
    *,
    retention_days: int,
    failed_retention_days: int | None,
    batch_size: int,
) -> PurgeReport:
    """Delete old Processed rows (and old Failed ones if a retention is set for them).

    Batch by batch, each in its own short transaction, skipping locked rows: it never holds a long
    lock and never waits for a relay. Attempt history goes with its message. On the partitioned
    layout, partitions are made ahead and those past retention dropped instead
    (``partitions.maintain``).
    """
    async with store.acquired(conn) as connection:
        if await partitions.is_partitioned(connection):
            done = await partitions.maintain(
                connection,
                retention_days=retention_days,
                failed_retention_days=failed_retention_days,
                batch_size=batch_size,
            )
            return PurgeReport(layout="partitioned", partitions=done.as_dict())
        report = PurgeReport()
        report.processed_deleted = await _purge(
            connection, "Processed", retention_days, batch_size, report
        )
        if failed_retention_days is not None:
            report.failed_deleted = await _purge(
                connection, "Failed", failed_retention_days, batch_size, report
            )
        return report


async def _purge(
    conn: store.Connection, status: str, days: int, batch_size: int, report: PurgeReport
) -> int:
    total = 0
    # Processed rows are read in created order, each batch after the last row the one before
    # deleted: rows finished within retention are passed over once, not at every batch.
    after: store.PurgePosition | None = None
    while True:
        if status == "Processed":
            deleted, last = await store.purge_processed(conn, days, batch_size, after)
            after = last or after
        else:
            deleted = await store.purge_batch(conn, status, days, batch_size)
        report.batches += 1
        total += deleted
        if deleted < batch_size:
            return total


# Inbox rows deleted per purge transaction.
INBOX_PURGE_BATCH_SIZE = 1000


@dataclass(slots=True)
class InboxPurgeReport:
    inbox_deleted: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def purge_inbox(
    conn: store.Connection, *, older_than_days: int, batch_size: int = INBOX_PURGE_BATCH_SIZE
) -> InboxPurgeReport:
    """Delete inbox rows received more than ``older_than_days`` ago, batch by batch, each in its
    own short transaction, skipping rows a consumer holds locked.

    A redelivery of a purged id would be processed again: keep rows longer than any event can
    come back (retries, and requeues by hand).
    """
    report = InboxPurgeReport()
    while True:
        deleted = await store.purge_inbox_batch(conn, older_than_days, batch_size)
        report.batches += 1
        report.inbox_deleted += deleted
        if deleted < batch_size:
            return report


async def show(conn: store.Connection, message_id: UUID) -> dict[str, Any] | None:
    """A message with its attempt history, or None if there is no such message."""
    message = await store.fetch_message(conn, message_id)
    if message is None:
        return None
    message["payload"], message["payload_as_text"] = read_payload(message["payload"])
    message["attempts"] = await store.fetch_attempts(conn, message_id)
    state = message.pop("endpoint_state")
    message["endpoints"] = endpoints_of(message, json.loads(state) if state else None)
    return finished(message)


def read_payload(stored: Any) -> tuple[Any, str | None]:
    """A payload as ``show`` gives it: the JSON value, not its text; or, when Python cannot
    decode it or write it out again, the database's text of it and why (``payload_as_text``).
    SQL stores what ``enqueue`` refuses and the relay still delivers: jsonb nested thousands
    deep, a number of thousands of digits."""
    if not isinstance(stored, str):
        return stored, None
    try:
        value = json.loads(stored)
        json.dumps(value)  # what show prints: nested deeper than it follows, it fails here
    except RecursionError:
        return stored, f"{UNREADABLE}: nested deeper than Python's JSON decoder follows"
    except ValueError:  # the database's jsonb text is JSON: what is left is a number's length
        return stored, (
            f"{UNREADABLE}: it holds a number of more than {sys.get_int_max_str_digits()} "
            "digits, Python's limit"
        )
    return value, None


def finished(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as ``show`` gives it: a finished row (``Processed`` or ``Failed``) is not due
    and not being processed, whatever its columns kept from its last lease, and says when it
    finished (``processed_at``, or the end of its last attempt, for a ``Failed`` one);
    ``finished_at`` is None for a message still under way."""
    done = message["status"] in (Status.PROCESSED, Status.FAILED)
    message["finished_at"] = None
    if done:
        message["next_attempt_at"] = None
        message["processing_started_at"] = None
        last = message["attempts"][-1]["finished_at"] if message["attempts"] else None
        message["finished_at"] = message["processed_at"] or last
    return message


def endpoints_of(
    message: dict[str, Any], state: dict[str, dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Where each endpoint that has been tried stands: its status, attempts and last error.

    Its kept state where the endpoints differ; otherwise the row's status, and the count and
    last error of the endpoint's attempts in the history."""
    history: dict[str, list[dict[str, Any]]] = {}
    for attempt in message["attempts"]:
        if attempt["endpoint"] is not None:
            history.setdefault(attempt["endpoint"], []).append(attempt)
    names = list(dict.fromkeys([*(state or {}), *history]))
    shown = []
    for name in names:
        tried = history.get(name, [])
        kept = (state or {}).get(name)
        shown.append(
            {
                "endpoint": name,
                "status": kept["status"] if kept else message["status"],
                "attempts": kept["attempts"] if kept else len(tried),
                "last_error": kept.get("error")
                if kept
                else (tried[-1]["error"] if tried else None),
            }
        )
    return shown


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
