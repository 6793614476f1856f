"""What the operator's console shows: the overview (its health first), the message list, a
message's detail and its whole payload, each endpoint's health and the actions taken
(``python -m outbox list | endpoints`` show the same).

Served by the console's HTTP API (``outbox.azure.console``, on the Functions app and under
``outbox serve``) and the commands; its actions are ``actions``'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from outbox.core.errors import BadRequestError, DatabaseError
from outbox.operations import inspection, sql, status
from outbox.operations.list_query import ActionQuery, MessageQuery, action_cursor, cursor
from outbox.operations.requests import Endpoints
from outbox.store.connection import Connection, database_boundary, fetch, transaction

# The list's scan is cut off after this long: a filter no index serves must be narrowed (a time
# range) rather than read the whole table.
LIST_TIMEOUT_MS = 3000
# The rows one call of the list reads at most (console_messages): a filter no index serves
# answers from the newest this many rows, with a cursor to go on searching.
CONSOLE_SCAN_LIMIT = 20_000
# The overview counts Processed rows up to this many, then estimates (the count is labelled so):
# counting every row of a table of 10M reads them all.
PROCESSED_COUNTED = 100_000
# Failures are grouped by reason over the latest Failed messages, at most this many.
FAILED_SAMPLE = 10_000
MAX_PAYLOAD_CHARS = 100_000
# An attempt's outcome as the console shows it: the attempt's own, never the row's status now.
ATTEMPT_OUTCOMES = {"Processed": "Processed", "Pending": "retry", "Failed": "Failed"}
# Error classes of an attempt that sent no request.
NOT_SENT = frozenset({"Undeliverable", "NotAttempted"})
NARROW = (
    "the filter matched too slowly (no index serves it over this many rows): narrow it with "
    "created_from/created_to or a status"
)


async def overview(
    conn: Connection,
    threshold_seconds: float,
    endpoints: Endpoints,
    *,
    notify_wakeups: bool = False,
) -> dict[str, Any]:
    """Counts by status (Processed estimated beyond ``PROCESSED_COUNTED``, then named in
    ``estimated_counts``), the oldest unpublished age, deliveries and failures per minute over the
    last hour, open and paused endpoints, held ordering keys, failures grouped by reason."""
    backlog = await status.backlog_status(
        conn, threshold_seconds, processed_up_to=PROCESSED_COUNTED, notify_wakeups=notify_wakeups
    )
    rates = await sql.rows(conn, "console_rates")
    reasons = await sql.rows(conn, "console_failure_reasons", FAILED_SAMPLE)
    held = await sql.rows(conn, "console_held_keys")
    return {
        "health": {
            "healthy": backlog.healthy,
            "problems": backlog.problems,
            "held_back": backlog.held_back,
            "oldest_unpublished_age_seconds": backlog.oldest_unpublished_age_seconds,
            "alert_threshold_seconds": backlog.alert_threshold_seconds,
        },
        "counts": backlog.counts,
        "estimated_counts": backlog.estimated_counts,
        "oldest_unpublished_age_seconds": backlog.oldest_unpublished_age_seconds,
        "healthy": backlog.healthy,
        "problems": backlog.problems,
        "held_back": backlog.held_back,
        "open_breakers": backlog.open_breakers,
        "paused_endpoints": backlog.paused_endpoints,
        "held_keys": held,
        "failure_reasons": reasons,
        "failure_sample": FAILED_SAMPLE,
        "rates": [
            {"minute": _iso(r["minute"]), "delivered": r["delivered"], "failed": r["failed"]}
            for r in rates
        ],
        "endpoints": {event_type: list(names) for event_type, names in endpoints.items()},
    }


class MessageFilter(NamedTuple):
    """The list's filters, each applied when not None (``endpoint_of``: the event types that
    have the endpoint ``endpoint``)."""

    status: str | None = None
    event_type: str | None = None
    endpoint: str | None = None
    endpoint_of: Sequence[str] | None = None
    ordering_key: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error: str | None = None


def message_filter(query: MessageQuery, endpoints: Endpoints) -> MessageFilter:
    """The statement's filter for ``query`` (an endpoint becomes the event types that have it)."""
    endpoint_of = None
    if query.endpoint is not None:
        endpoint_of = [t for t, names in endpoints.items() if query.endpoint in names]
    return MessageFilter(
        query.status,
        query.event_type,
        query.endpoint,
        endpoint_of,
        query.ordering_key,
        query.created_from,
        query.created_to,
        query.error,
    )


def console_statement() -> str:
    """``console_messages`` with the rows it reads, the ``console_scanned`` clause, spliced in."""
    statement = sql.QUERIES["console_messages"]
    if statement.count("FROM console_scanned AS scanned") != 2:
        raise ValueError("console_messages no longer has the shape console_scanned is spliced into")
    clause = sql.QUERIES["console_scanned"].strip().rstrip(";")
    return statement.replace("FROM console_scanned AS scanned", f"FROM ({clause}) AS scanned")


def scan_limit(wanted: MessageFilter, limit: int) -> int:
    """The rows each of the list's scans reads at most for ``limit`` rows: ``limit`` itself when
    the scans apply every filter given (none, a status, a time range), each row read being a row
    shown, so the backlog's scan, which sorts what it reads, keeps the newest ``limit`` rather
    than ``CONSOLE_SCAN_LIMIT`` (spilled to disk at 500,000 Pending); ``CONSOLE_SCAN_LIMIT``
    where a filter no index serves may pass rows over."""
    unindexed = (wanted.event_type, wanted.endpoint_of, wanted.ordering_key, wanted.error)
    return limit if all(value is None for value in unindexed) else CONSOLE_SCAN_LIMIT


def console_message_arguments(
    wanted: MessageFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    scan_limit: int | None = None,
) -> tuple[Any, ...]:
    """console_messages' parameters, in order (``scan_limit``: ``CONSOLE_SCAN_LIMIT``)."""
    return (
        wanted.status,
        wanted.event_type,
        list(wanted.endpoint_of) if wanted.endpoint_of is not None else None,
        wanted.endpoint,
        wanted.ordering_key,
        wanted.created_from,
        wanted.created_to,
        wanted.error,
        *(after or (None, None)),
        limit,
        wanted.status,
        scan_limit or CONSOLE_SCAN_LIMIT,
    )


@database_boundary
async def console_messages(
    conn: Connection,
    wanted: MessageFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    *,
    timeout_ms: int,
    scan_limit: int | None = None,
) -> list[dict[str, Any]]:
    """One page of messages matching ``wanted``, newest first, after the row ``after``, found
    among at most ``scan_limit`` rows (``CONSOLE_SCAN_LIMIT``); when the scan stopped there, a
    last row with ``scan_end`` true is where it stopped. A statement slower than ``timeout_ms``
    is cancelled (``QueryCanceledError``)."""
    arguments = console_message_arguments(wanted, after, limit, scan_limit)
    async with transaction(conn) as connection:
        await sql.value(connection, "console_list_limits", str(int(timeout_ms)))
        rows = await fetch(connection, console_statement(), *arguments)
    return [dict(row) for row in rows]


async def list_messages(
    conn: Connection, query: MessageQuery, endpoints: Endpoints
) -> dict[str, Any]:
    """One page of messages matching ``query``, newest first, and the cursor of the next. Each
    call reads at most ``CONSOLE_SCAN_LIMIT`` rows: when a filter no index serves found fewer
    than a page among them, ``scan_limited`` is true and ``next`` goes on searching."""
    wanted = message_filter(query, endpoints)
    try:
        rows = await console_messages(
            conn,
            wanted,
            query.after,
            query.limit + 1,
            timeout_ms=LIST_TIMEOUT_MS,
            scan_limit=scan_limit(wanted, query.limit + 1),
        )
    except DatabaseError as exc:
        if exc.kind == "QueryCanceledError":
            raise BadRequestError(NARROW) from None
        raise
    found = [row for row in rows if not row["scan_end"]]
    scan_end = [row for row in rows if row["scan_end"]]
    page = found[: query.limit]
    following, limited = None, False
    if len(found) > query.limit:
        last = page[-1]
        following = cursor(last["created_at"], last["outbox_message_id"])
    elif scan_end:
        following = cursor(scan_end[0]["created_at"], scan_end[0]["outbox_message_id"])
        limited = True
    return {
        "messages": [_listed(row) for row in page],
        "next": following,
        "scan_limited": limited,
        "scan_limit": CONSOLE_SCAN_LIMIT,
    }


async def message(
    conn: Connection, message_id: UUID, *, hold_on_failure: bool = True
) -> dict[str, Any] | None:
    """A message as the console shows it: payload (its first ``MAX_PAYLOAD_CHARS``), each
    endpoint's state, the attempt timeline with each attempt's own outcome, the message that
    holds it back (``held_behind``, under ``hold_on_failure`` a Failed one too), the trace id.
    (Attempts hold what the relay recorded: redacted, never a header's value.)"""
    shown = await inspection.show(conn, message_id)
    if shown is None:
        return None
    as_text = shown.pop("payload_as_text")
    payload = _pretty(shown.pop("payload"), as_text)
    context = shown.pop("trace_context", None)
    trace = json.loads(context) if isinstance(context, str) else context
    parent = trace.get("traceparent") if isinstance(trace, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    resent = await sql.value(conn, "resend_started", str(message_id))
    attempts = [
        {k: v for k, v in attempt.items() if k != "lease_token"}
        | {
            "outcome": attempt_outcome(attempt),
            "resend": resent is not None and attempt["finished_at"] >= resent,
        }
        for attempt in shown["attempts"]
    ]
    behind = await sql.value(conn, "held_behind", message_id, hold_on_failure)
    detail: dict[str, Any] = jsonable(
        {
            "outbox_message_id": shown["outbox_message_id"],
            "event_type": shown["event_type"],
            "status": shown["status"],
            "attempt_count": shown["attempt_count"],
            "created_at": shown["created_at"],
            "next_attempt_at": shown["next_attempt_at"],
            "processed_at": shown["processed_at"],
            "finished_at": shown["finished_at"],
            "ordering_key": shown.get("ordering_key"),
            "held_behind": behind,
            "last_error": shown["last_error"],
            "trace_id": parts[1] if len(parts) == 4 else None,
            "payload": payload[:MAX_PAYLOAD_CHARS],
            "payload_truncated": len(payload) > MAX_PAYLOAD_CHARS,
            "payload_as_text": as_text,
            "endpoints": shown["endpoints"],
            "attempts": attempts,
        }
    )
    return detail


def attempt_outcome(attempt: Mapping[str, Any]) -> str:
    """An attempt's own outcome: ``Processed``, ``retry`` (it failed and was to be tried again),
    ``Failed`` (it ended the endpoint's delivery) or ``not sent`` (no request was made: no
    endpoint, a payload too large)."""
    if attempt.get("error_class") in NOT_SENT:
        return "not sent"
    return ATTEMPT_OUTCOMES.get(attempt["outcome"], str(attempt["outcome"]))


async def payload(conn: Connection, message_id: UUID) -> str | None:
    """Message ``message_id``'s whole payload, as the database writes it (JSON text); None when
    there is no such message."""
    text: str | None = await sql.value(conn, "show_payload", message_id)
    return text


def _pretty(payload: Any, as_text: str | None) -> str:
    """The payload as the detail shows it: indented JSON (``show`` has checked that it can be
    written out), or the database's text when ``show`` could not decode it (``as_text``)."""
    if as_text is not None:
        return str(payload)
    return json.dumps(payload, indent=2, ensure_ascii=False)


async def actions(conn: Connection, query: ActionQuery | None = None) -> dict[str, Any]:
    """One page of the recorded actions, newest first (``actions``), and the cursor of the next
    page (``next``, the ``before`` that continues it; None on the last)."""
    query = query or ActionQuery()
    rows = await sql.rows(
        conn,
        "list_actions",
        query.limit + 1,
        *(query.before or (None, None)),
        query.actor,
        query.action,
        query.since,
        query.until,
    )
    following = None
    if len(rows) > query.limit:
        rows = rows[: query.limit]
        following = action_cursor(rows[-1]["created_at"], rows[-1]["action_id"])
    listed = []
    for row in rows:
        row["filter"] = json.loads(row["filter"])
        row["result"] = json.loads(row["result"]) if row["result"] else None
        listed.append(jsonable(row))
    return {"actions": listed, "next": following}


async def endpoints_page(
    conn: Connection, endpoints: Endpoints, hosts: Mapping[tuple[str, str], str]
) -> list[dict[str, Any]]:
    """Every configured endpoint as the console's endpoints page shows it: its host
    (``hosts``: never a path or a query), its state (``healthy``, ``open``, ``half-open`` as
    ``status`` says, or ``paused``: an operator's pause comes first), its breaker (since when,
    failures in a row, next probe), who paused it, and its rates over the last hour."""
    facts = await _endpoint_facts(conn)
    shown = []
    for event_type, names in endpoints.items():
        for name in names:
            key = (event_type, name)
            breaker, row = facts.open.get(key), facts.breakers.get(key)
            paused, seen = facts.paused.get(key), facts.activity.get(key)
            attempts = seen["attempts"] if seen else 0
            failures = seen["failures"] if seen else 0
            state = "paused" if paused else (breaker["state"] if breaker else "healthy")
            shown.append(
                {
                    "event_type": event_type,
                    "endpoint": name,
                    "url_host": hosts.get(key),
                    "state": state,
                    "breaker_since": _iso(breaker["opened_at"]) if breaker else None,
                    "failures": row["consecutive_failures"] if row else 0,
                    "next_probe": _iso(breaker["reopen_at"]) if breaker else None,
                    "paused_by": paused["paused_by"] if paused else None,
                    "paused_at": _iso(paused["paused_at"]) if paused else None,
                    "delivered_per_minute": round((attempts - failures) / 60, 2),
                    "failed_per_minute": round(failures / 60, 2),
                    "attempts_last_hour": attempts,
                }
            )
    return shown


class _EndpointFacts(NamedTuple):
    """What the database says of the endpoints, each by (event type, endpoint)."""

    open: dict[tuple[str, str], dict[str, Any]]  # breakers holding deliveries back
    breakers: dict[tuple[str, str], dict[str, Any]]  # every breaker row, open or counting
    paused: dict[tuple[str, str], dict[str, Any]]
    activity: dict[tuple[str, str], dict[str, Any]]  # attempts over the last hour


async def _endpoint_facts(conn: Connection) -> _EndpointFacts:
    def by_key(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(r["event_type"], r["endpoint"]): r for r in rows}

    return _EndpointFacts(
        by_key(await sql.rows(conn, "open_breakers")),
        by_key(await sql.rows(conn, "endpoint_breakers")),
        by_key(await sql.rows(conn, "paused_endpoints")),
        by_key(await sql.rows(conn, "endpoint_activity")),
    )


async def endpoint_health(conn: Connection, endpoints: Endpoints) -> list[dict[str, Any]]:
    """Each configured endpoint: its breaker (``open``, ``half-open`` or ``closed``, as
    ``status`` lists them), whether paused, and over the last hour its last success and failure
    and its failure rate (``python -m outbox endpoints``)."""
    facts = await _endpoint_facts(conn)
    breakers, paused, activity = facts.open, facts.paused, facts.activity
    shown = []
    for event_type, names in endpoints.items():
        for name in names:
            breaker = breakers.get((event_type, name))
            seen = activity.get((event_type, name))
            shown.append(
                {
                    "event_type": event_type,
                    "endpoint": name,
                    "breaker": breaker["state"] if breaker else "closed",
                    "consecutive_failures": breaker["consecutive_failures"] if breaker else 0,
                    "paused": (event_type, name) in paused,
                    "last_success": _iso(seen["last_success"]) if seen else None,
                    "last_failure": _iso(seen["last_failure"]) if seen else None,
                    "attempts_last_hour": seen["attempts"] if seen else 0,
                    "failure_rate_last_hour": (
                        round(seen["failures"] / seen["attempts"], 3) if seen else None
                    ),
                }
            )
    return shown


def _listed(row: Mapping[str, Any]) -> dict[str, Any]:
    listed: dict[str, Any] = jsonable({k: v for k, v in row.items() if k != "scan_end"})
    return listed


def jsonable(value: Any) -> Any:
    """``value`` with its times and ids as JSON's text, through lists and dicts."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
