"""The operator's console over the outbox: the overview, the message list, a message's detail,
and the actions (pause, resume, a requeue by filter) with their record.

Shared by the console's HTTP API (``outbox.azure.triggers``, served by the Functions app and by
``outbox serve``) and the commands (``python -m outbox list | endpoints | pause | resume``).
Every action is recorded in ``outbox_console_actions`` under an id the caller chooses: the same
id sent again does the action once and answers with what the first one did (``act``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict
from datetime import datetime
from typing import Any
from uuid import UUID

from outbox.core import requests
from outbox.core.errors import BadRequestError, DatabaseError
from outbox.core.queries import MessageQuery, cursor
from outbox.core.requests import RequeueFilter
from outbox.store import operations
from outbox.store import postgres as store

# The list's scan is cut off after this long: a filter no index serves must be narrowed (a time
# range) rather than read the whole table.
LIST_TIMEOUT_MS = 3000
# The overview counts Processed rows up to this many, then estimates (the count is labelled so):
# counting every row of a table of 10M reads them all.
PROCESSED_COUNTED = 100_000
# Failures are grouped by reason over the latest Failed messages, at most this many.
FAILED_SAMPLE = 10_000
MAX_PAYLOAD_CHARS = 100_000
ACTIONS_LISTED = 50
NARROW = (
    "the filter matched too slowly (no index serves it over this many rows): narrow it with "
    "created_from/created_to or a status"
)

# Each event type's endpoint names, as configured.
Endpoints = Mapping[str, Sequence[str]]


async def overview(
    conn: store.Connection,
    threshold_seconds: float,
    endpoints: Endpoints,
    *,
    notify_wakeups: bool = False,
) -> dict[str, Any]:
    """Counts by status (Processed estimated beyond ``PROCESSED_COUNTED``, then named in
    ``estimated_counts``), the oldest unpublished age, deliveries and failures per minute over the
    last hour, open and paused endpoints, held ordering keys, failures grouped by reason."""
    status = await operations.backlog_status(
        conn, threshold_seconds, processed_up_to=PROCESSED_COUNTED, notify_wakeups=notify_wakeups
    )
    figures = await store.console_overview(conn, FAILED_SAMPLE)
    return {
        "counts": status.counts,
        "estimated_counts": status.estimated_counts,
        "oldest_unpublished_age_seconds": status.oldest_unpublished_age_seconds,
        "healthy": status.healthy,
        "problems": status.problems,
        "held_back": status.held_back,
        "open_breakers": status.open_breakers,
        "paused_endpoints": status.paused_endpoints,
        "held_keys": figures["held_keys"],
        "failure_reasons": figures["failure_reasons"],
        "failure_sample": FAILED_SAMPLE,
        "rates": [
            {"minute": _iso(r["minute"]), "delivered": r["delivered"], "failed": r["failed"]}
            for r in figures["rates"]
        ],
        "endpoints": {event_type: list(names) for event_type, names in endpoints.items()},
    }


def message_filter(query: MessageQuery, endpoints: Endpoints) -> store.MessageFilter:
    """The store's filter for ``query`` (an endpoint becomes the event types that have it)."""
    endpoint_of = None
    if query.endpoint is not None:
        endpoint_of = [t for t, names in endpoints.items() if query.endpoint in names]
    return store.MessageFilter(
        query.status,
        query.event_type,
        query.endpoint,
        endpoint_of,
        query.ordering_key,
        query.created_from,
        query.created_to,
        query.error,
    )


async def list_messages(
    conn: store.Connection, query: MessageQuery, endpoints: Endpoints
) -> dict[str, Any]:
    """One page of messages matching ``query``, newest first, and the cursor of the next. Each
    call reads at most ``store.CONSOLE_SCAN_LIMIT`` rows: when a filter no index serves found
    fewer than a page among them, ``scan_limited`` is true and ``next`` goes on searching."""
    wanted = message_filter(query, endpoints)
    try:
        rows = await store.console_messages(
            conn, wanted, query.after, query.limit + 1, timeout_ms=LIST_TIMEOUT_MS
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
        "scan_limit": store.CONSOLE_SCAN_LIMIT,
    }


async def message(conn: store.Connection, message_id: UUID) -> dict[str, Any] | None:
    """A message as the console shows it: payload, each endpoint's state, the attempt timeline,
    the trace id. (Attempts hold what the relay recorded: redacted, never a header's value.)"""
    shown = await operations.show(conn, message_id)
    if shown is None:
        return None
    as_text = shown.pop("payload_as_text")
    payload = _pretty(shown.pop("payload"), as_text)
    context = shown.pop("trace_context", None)
    trace = json.loads(context) if isinstance(context, str) else context
    parent = trace.get("traceparent") if isinstance(trace, dict) else None
    parts = parent.split("-") if isinstance(parent, str) else []
    resent = await store.resend_started(conn, message_id)
    attempts = [
        {k: v for k, v in attempt.items() if k != "lease_token"}
        | {"resend": resent is not None and attempt["finished_at"] >= resent}
        for attempt in shown["attempts"]
    ]
    detail: dict[str, Any] = _jsonable(
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


def _pretty(payload: Any, as_text: str | None) -> str:
    """The payload as the detail shows it: indented JSON (``show`` has checked that it can be
    written out), or the database's text when ``show`` could not decode it (``as_text``)."""
    if as_text is not None:
        return str(payload)
    return json.dumps(payload, indent=2, ensure_ascii=False)


def key_of(endpoints: Endpoints, event_type: Any, endpoint: Any) -> tuple[str, str]:
    """The (event type, endpoint) an action names, checked against the configuration."""
    if not isinstance(event_type, str) or not event_type:
        raise BadRequestError("event_type must be an event type")
    configured = endpoints.get(event_type, ())
    if endpoint is None and len(configured) == 1:
        return event_type, configured[0]  # an event type's only endpoint needs no name
    if not isinstance(endpoint, str) or not endpoint:
        raise BadRequestError("endpoint must be an endpoint's name")
    if endpoint not in endpoints.get(event_type, ()):
        raise BadRequestError(
            f"endpoint {endpoint!r} is not configured for event type {event_type!r}"
        )
    return event_type, endpoint


async def pause(
    conn: store.Connection, key: tuple[str, str], *, actor: str, action_id: str | None = None
) -> dict[str, Any]:
    """Pause endpoint ``key`` for every relay: its deliveries wait, spending no attempt."""

    async def run(connection: store.Connection) -> tuple[int, dict[str, Any]]:
        changed = await store.pause_endpoint(connection, key, actor)
        return int(changed), {"paused": True, "changed": changed}

    return await act(conn, "pause", _key_filter(key), run, actor=actor, action_id=action_id)


async def resume(
    conn: store.Connection, key: tuple[str, str], *, actor: str, action_id: str | None = None
) -> dict[str, Any]:
    """Resume endpoint ``key``: what waited for it is due now (the caller wakes a drain)."""

    async def run(connection: store.Connection) -> tuple[int, dict[str, Any]]:
        changed, due = await store.resume_endpoint(connection, key)
        return due, {"paused": False, "changed": changed, "due": due}

    return await act(conn, "resume", _key_filter(key), run, actor=actor, action_id=action_id)


async def requeue(
    conn: store.Connection,
    wanted: RequeueFilter,
    *,
    dry_run: bool,
    actor: str,
    action_id: str | None = None,
) -> dict[str, Any]:
    """``operations.requeue``, recorded (a dry run changes nothing and is not recorded)."""
    if dry_run:
        return (await operations.requeue(conn, wanted, dry_run=True)).as_dict()

    async def run(connection: store.Connection) -> tuple[int, dict[str, Any]]:
        report = await operations.requeue(connection, wanted, dry_run=False)
        return report.requeued, report.as_dict()

    shown = _jsonable({k: v for k, v in asdict(wanted).items() if v not in (None, False)})
    # Not atomic: a requeue commits batch by batch, however many rows match.
    return await act(conn, "requeue", shown, run, actor=actor, action_id=action_id, atomic=False)


async def requeue_batch(
    conn: store.Connection,
    wanted: RequeueFilter,
    *,
    batch_size: int,
    actor: str,
    action_id: str,
) -> dict[str, Any]:
    """One batch of a requeue recorded as ``action_id``: the first call records it, each call
    sets back at most ``batch_size`` more Failed rows, going on where the last batch ended, and
    answers with the running count (``requeued``), this call's (``batch_requeued``) and whether
    it is ``done``. A call repeated or retried goes on from the last batch that committed (no
    row is requeued twice under one action); one after the last batch requeues nothing."""
    checked = requests.parse(requests.RequeueRequest, asdict(wanted)).filter
    shown = _jsonable({k: v for k, v in asdict(checked).items() if v not in (None, False)})
    filter_json = json.dumps(shown)
    claimed = await store.claim_action(
        conn, action_id, "requeue", filter_json, dry_run=False, actor=actor
    )
    if not claimed:
        earlier = await store.show_action(conn, action_id)
        if earlier is None:
            raise BadRequestError(f"action_id {action_id!r} was used for another action")
        _check_same(earlier, "requeue", filter_json, action_id)
    # Its first progress, unless a call wrote it already: written apart from the claim, so a
    # call that ended between the two leaves an action the next call goes on with.
    fresh = {"requeued": 0, "batches": 0, "done": False, "after": None}
    await _execute(conn, "start_action", action_id, json.dumps(fresh))
    ids = list(checked.message_ids) if checked.message_ids is not None else None
    step = await store.requeue_failed_step(
        conn,
        action_id,
        (ids, checked.event_type, checked.created_from, checked.created_to),
        batch_size=batch_size,
        endpoint=checked.endpoint,
        error=checked.error,
    )
    if step.progress is None:
        return {"action_id": action_id, "in_progress": True, "repeated": True, "done": False}
    return {
        "requeued": step.progress["requeued"],
        "batch_requeued": len(step.rows),
        "batches": step.progress.get("batches", 1),
        "done": step.progress.get("done", True),
        "dry_run": False,
        "message_ids": [
            str(r["outbox_message_id"]) for r in step.rows[: operations.MAX_LISTED_IDS]
        ],
        "action_id": action_id,
        "repeated": not step.rows and not claimed,
    }


MAX_RESENT = 1000


async def resend(
    conn: store.Connection,
    message_ids: Sequence[UUID],
    endpoint: str | None,
    endpoints: Endpoints,
    *,
    actor: str,
    action_id: str | None = None,
) -> dict[str, Any]:
    """Send Processed messages again, with their own ids (the same ``webhook-id``): to
    ``endpoint`` alone (it must be one of the message's event type), or to every endpoint.
    A message that is not Processed is left as it is and listed under ``skipped``."""
    if not message_ids or len(message_ids) > MAX_RESENT:
        raise BadRequestError(f"message_ids must list 1 to {MAX_RESENT} message ids")

    async def run(connection: store.Connection) -> tuple[int, dict[str, Any]]:
        resent: list[str] = []
        skipped: list[str] = []
        for message_id in message_ids:
            found = await store.fetch_message(connection, message_id)
            names = endpoints.get(found["event_type"], ()) if found else ()
            if found is None or (endpoint is not None and endpoint not in names):
                skipped.append(str(message_id))
                continue
            done = await store.resend_processed(connection, message_id, endpoint, names)
            (resent if done else skipped).append(str(message_id))
        return len(resent), {"resent": resent, "skipped": skipped}

    shown = {"message_ids": [str(i) for i in message_ids], "endpoint": endpoint}
    return await act(conn, "resend", shown, run, actor=actor, action_id=action_id)


async def act(
    conn: store.Connection,
    action: str,
    filter_: dict[str, Any],
    run: Callable[[store.Connection], Awaitable[tuple[int, dict[str, Any]]]],
    *,
    actor: str,
    action_id: str | None,
    atomic: bool = True,
) -> dict[str, Any]:
    """Record ``action`` under ``action_id`` and run it, once, on one connection. An id whose
    run finished answers with its result (``repeated``); one that another call runs now answers
    ``in_progress`` at once (the console's 409). An id whose call ended without a result (its
    session ended while it waited on a row lock: the call answered 503) is run again, as a
    client retrying after an error expects: with ``atomic`` (every action but a requeue, which
    commits batch by batch) its writes and its result commit together, so the failed call left
    nothing done; a requeue run again goes on with the rows still Failed."""
    action_id = action_id or str(uuid.uuid4())
    filter_json = json.dumps(filter_)
    async with store.acquired(conn) as connection, _running(connection, action_id) as running:
        earlier = await store.show_action(connection, action_id)
        if earlier is not None:
            _check_same(earlier, action, filter_json, action_id)
            if earlier["result"] is not None:
                result = json.loads(earlier["result"])
                return {**result, "action_id": action_id, "repeated": True}
        if not running:
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        if earlier is None and not await store.claim_action(
            connection, action_id, action, filter_json, dry_run=False, actor=actor
        ):  # recorded meanwhile by a call that takes no lock: a requeue in batches
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        if not atomic:
            return await _run(connection, action_id, run)
        return await _run_atomically(connection, action_id, run)


async def _run(
    connection: store.Connection,
    action_id: str,
    run: Callable[[store.Connection], Awaitable[tuple[int, dict[str, Any]]]],
) -> dict[str, Any]:
    affected, result = await run(connection)
    await store.finish_action(connection, action_id, affected, json.dumps(result))
    return {**result, "action_id": action_id, "repeated": False}


@store.database_boundary
async def _run_atomically(
    connection: store.Connection,
    action_id: str,
    run: Callable[[store.Connection], Awaitable[tuple[int, dict[str, Any]]]],
) -> dict[str, Any]:
    """``_run`` in one transaction: the action's writes and its result commit together."""
    async with connection.transaction():
        return await _run(connection, action_id, run)


def _check_same(earlier: Mapping[str, Any], action: str, filter_json: str, action_id: str) -> None:
    """An action id names one action on one filter: reused for another, it is refused."""
    if earlier["action"] != action:
        raise BadRequestError(f"action_id {action_id!r} was used for another action")
    if json.loads(earlier["filter"]) != json.loads(filter_json):
        raise BadRequestError(f"action_id {action_id!r} was used for another filter")


@asynccontextmanager
async def _running(connection: store.Connection, action_id: str) -> AsyncIterator[bool]:
    """Whether this session runs action ``action_id`` (``run_action``'s lock, held until the
    block ends). The lock ends with the session: when it cannot be released, the session is
    ended, so that no later call meets a lock with no run behind it."""
    try:
        running = bool(await _fetchval(connection, "run_action", action_id))
    except BaseException:  # cancelled, say: the lock may be the session's all the same
        _end_session(connection)
        raise
    try:
        yield running
    finally:
        if running:
            try:
                await _fetchval(connection, "end_action_run", action_id)
            except DatabaseError:
                _end_session(connection)  # and the error that ended the run goes on
            except BaseException:
                _end_session(connection)
                raise


def _end_session(connection: store.Connection) -> None:
    """End ``connection``'s session, and with it the locks it holds (the pool makes another)."""
    with suppress(*store.TRANSIENT_ERRORS):  # lost already: the session has ended
        connection.terminate()


@store.database_boundary
async def _fetchval(connection: store.Connection, name: str, *args: Any) -> Any:
    return await connection.fetchval(store.QUERIES[name], *args)


@store.database_boundary
async def _execute(connection: store.Connection, name: str, *args: Any) -> None:
    await connection.execute(store.QUERIES[name], *args)


async def actions(conn: store.Connection, limit: int = ACTIONS_LISTED) -> list[dict[str, Any]]:
    """The latest recorded actions, newest first."""
    listed = []
    for row in await store.list_actions(conn, limit):
        row["filter"] = json.loads(row["filter"])
        row["result"] = json.loads(row["result"]) if row["result"] else None
        listed.append(_jsonable(row))
    return listed


async def endpoint_health(conn: store.Connection, endpoints: Endpoints) -> list[dict[str, Any]]:
    """Each configured endpoint: its breaker (``open``, ``half-open`` or ``closed``, as
    ``status`` lists them), whether paused, and over the last hour its last success and failure
    and its failure rate (``python -m outbox endpoints``)."""
    breakers = {(b["event_type"], b["endpoint"]): b for b in await store.open_breakers(conn)}
    paused = {(p["event_type"], p["endpoint"]): p for p in await store.paused_endpoints(conn)}
    activity = {(a["event_type"], a["endpoint"]): a for a in await store.endpoint_activity(conn)}
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


def _key_filter(key: tuple[str, str]) -> dict[str, Any]:
    return {"event_type": key[0], "endpoint": key[1]}


def _listed(row: Mapping[str, Any]) -> dict[str, Any]:
    listed: dict[str, Any] = _jsonable({k: v for k, v in row.items() if k != "scan_end"})
    return listed


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    return value


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
