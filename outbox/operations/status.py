"""The backlog's health (``python -m outbox status``, ``GET /api/outbox/status``, the console's
overview): counts, the ages an on-call engineer alerts on, open breakers, paused endpoints, the
database's clock against this host's, the NOTIFY queue and the layout.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from outbox.core.models import Status
from outbox.core.settings import NOTIFY_QUEUE_ALERT_USAGE
from outbox.core.telemetry import Backlog, Telemetry, process_telemetry
from outbox.operations import sql
from outbox.store import partitions
from outbox.store.connection import Connection, acquired
from outbox.store.notify import notify_queue_usage

# A host clock further off the database's than this is reported by status.
MAX_CLOCK_OFFSET_SECONDS = 60.0


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
    conn: Connection,
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
    row = await sql.row(conn, "backlog_status", processed_up_to)
    assert row is not None  # one row, whatever the table holds
    breakers = await sql.rows(conn, "open_breakers")
    paused = await sql.rows(conn, "paused_endpoints")
    notify_usage = await notify_queue_usage(conn)
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
        async with acquired(conn) as connection:
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


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)
