"""The operator's actions (pause, resume, a requeue by filter, resend), each recorded once.

Shared by the console's HTTP API (``outbox.azure.console`` and ``outbox.azure.triggers``) and the
commands (``python -m outbox pause | resume | requeue | resend``). Every action is recorded in
``outbox_console_actions`` under an id the caller chooses: the same id sent again does the action
once and answers with what the first one did (``act``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any
from uuid import UUID

from outbox.core.errors import BadRequestError, DatabaseError
from outbox.operations import requests, sql
from outbox.operations.replay import MAX_LISTED_IDS, requeue_failed_step
from outbox.operations.replay import requeue as requeue_now
from outbox.operations.requests import Endpoints, RequeueFilter
from outbox.operations.views import jsonable
from outbox.store.connection import (
    Connection,
    acquired,
    database_boundary,
    end_session,
    transaction,
)

MAX_RESENT = 1000
# What an action's run does: on its connection, the rows it affected and its result.
Run = Callable[[Connection], Awaitable[tuple[int, dict[str, Any]]]]


async def pause(
    conn: Connection, key: tuple[str, str], *, actor: str, action_id: str | None = None
) -> dict[str, Any]:
    """Pause endpoint ``key`` for every relay: its deliveries wait, spending no attempt."""

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        changed = bool(await sql.value(connection, "pause_endpoint", *key, actor))
        return int(changed), {"paused": True, "changed": changed}

    return await act(conn, "pause", _key_filter(key), run, actor=actor, action_id=action_id)


async def resume(
    conn: Connection, key: tuple[str, str], *, actor: str, action_id: str | None = None
) -> dict[str, Any]:
    """Resume endpoint ``key``: what waited for it is due now (the caller wakes a drain)."""

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        row = await sql.row(connection, "resume_endpoint", *key)
        assert row is not None  # one row, paused or not
        changed, due = bool(row["resumed"]), int(row["due"])
        return due, {"paused": False, "changed": changed, "due": due}

    return await act(conn, "resume", _key_filter(key), run, actor=actor, action_id=action_id)


async def requeue(
    conn: Connection,
    wanted: RequeueFilter,
    *,
    dry_run: bool,
    actor: str,
    action_id: str | None = None,
) -> dict[str, Any]:
    """``operations.requeue``, recorded (a dry run changes nothing and is not recorded)."""
    if dry_run:
        return (await requeue_now(conn, wanted, dry_run=True)).as_dict()

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        report = await requeue_now(connection, wanted, dry_run=False)
        return report.requeued, report.as_dict()

    shown = jsonable({k: v for k, v in asdict(wanted).items() if v not in (None, False)})
    # Not atomic: a requeue commits batch by batch, however many rows match.
    return await act(conn, "requeue", shown, run, actor=actor, action_id=action_id, atomic=False)


async def requeue_batch(
    conn: Connection,
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
    shown = jsonable({k: v for k, v in asdict(checked).items() if v not in (None, False)})
    filter_json = json.dumps(shown)
    claimed = await _claim(conn, action_id, "requeue", filter_json, actor)
    if not claimed:
        earlier = await sql.row(conn, "show_action", action_id)
        if earlier is None:
            raise BadRequestError(f"action_id {action_id!r} was used for another action")
        _check_same(earlier, "requeue", filter_json, action_id)
    # Its first progress, unless a call wrote it already: written apart from the claim, so a
    # call that ended between the two leaves an action the next call goes on with.
    fresh = {"requeued": 0, "batches": 0, "done": False, "after": None}
    await sql.execute(conn, "start_action", action_id, json.dumps(fresh))
    ids = list(checked.message_ids) if checked.message_ids is not None else None
    step = await requeue_failed_step(
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
        "message_ids": [str(r["outbox_message_id"]) for r in step.rows[:MAX_LISTED_IDS]],
        "action_id": action_id,
        "repeated": not step.rows and not claimed,
    }


async def resend(
    conn: Connection,
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

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        resent: list[str] = []
        skipped: list[str] = []
        for message_id in message_ids:
            found = await sql.row(connection, "show_message", message_id)
            names = endpoints.get(found["event_type"], ()) if found else ()
            if found is None or (endpoint is not None and endpoint not in names):
                skipped.append(str(message_id))
                continue
            done = await sql.value(
                connection, "resend_processed", message_id, endpoint, list(names)
            )
            (resent if done is not None else skipped).append(str(message_id))
        return len(resent), {"resent": resent, "skipped": skipped}

    shown = {"message_ids": [str(i) for i in message_ids], "endpoint": endpoint}
    return await act(conn, "resend", shown, run, actor=actor, action_id=action_id)


async def act(
    conn: Connection,
    action: str,
    filter_: dict[str, Any],
    run: Run,
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
    async with acquired(conn) as connection, _running(connection, action_id) as running:
        earlier = await sql.row(connection, "show_action", action_id)
        if earlier is not None:
            _check_same(earlier, action, filter_json, action_id)
            if earlier["result"] is not None:
                result = json.loads(earlier["result"])
                return {**result, "action_id": action_id, "repeated": True}
        if not running:
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        if earlier is None and not await _claim(connection, action_id, action, filter_json, actor):
            # recorded meanwhile by a call that takes no lock: a requeue in batches
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        if not atomic:
            return await _run(connection, action_id, run)
        return await _run_atomically(connection, action_id, run)


async def _claim(
    conn: Connection, action_id: str, action: str, filter_json: str, actor: str
) -> bool:
    """Record an action before it is done; False when an action of that id was recorded."""
    claimed = await sql.row(conn, "claim_action", action_id, action, filter_json, False, actor)
    return claimed is not None


async def _run(connection: Connection, action_id: str, run: Run) -> dict[str, Any]:
    affected, result = await run(connection)
    await sql.execute(connection, "finish_action", action_id, affected, json.dumps(result))
    return {**result, "action_id": action_id, "repeated": False}


@database_boundary
async def _run_atomically(connection: Connection, action_id: str, run: Run) -> dict[str, Any]:
    """``_run`` in one transaction: the action's writes and its result commit together."""
    async with transaction(connection) as same:
        return await _run(same, action_id, run)


def _check_same(earlier: Mapping[str, Any], action: str, filter_json: str, action_id: str) -> None:
    """An action id names one action on one filter: reused for another, it is refused."""
    if earlier["action"] != action:
        raise BadRequestError(f"action_id {action_id!r} was used for another action")
    if json.loads(earlier["filter"]) != json.loads(filter_json):
        raise BadRequestError(f"action_id {action_id!r} was used for another filter")


@asynccontextmanager
async def _running(connection: Connection, action_id: str) -> AsyncIterator[bool]:
    """Whether this session runs action ``action_id`` (``run_action``'s lock, held until the
    block ends). The lock ends with the session: when it cannot be released, the session is
    ended, so that no later call meets a lock with no run behind it."""
    try:
        running = bool(await sql.value(connection, "run_action", action_id))
    except BaseException:  # cancelled, say: the lock may be the session's all the same
        end_session(connection)
        raise
    try:
        yield running
    finally:
        if running:
            try:
                await sql.value(connection, "end_action_run", action_id)
            except DatabaseError:
                end_session(connection)  # and the error that ended the run goes on
            except BaseException:
                end_session(connection)
                raise


def _key_filter(key: tuple[str, str]) -> dict[str, Any]:
    return {"event_type": key[0], "endpoint": key[1]}
