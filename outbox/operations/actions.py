"""The operator's actions (pause, resume, a requeue by filter, resend, cancel, a breaker's probe
now, a drain), each recorded once, with who did it (``Actor``).

Shared by the console's HTTP API (``outbox.azure.console`` and ``outbox.azure.triggers``) and the
commands (``python -m outbox pause | resume | requeue | resend | cancel | probe``). Every action
is recorded in ``outbox_console_actions`` under an id the caller chooses: the same id sent again
does the action once and answers with what the first one did (``act``). A replay of a window is
``replay_window``'s. An id or an endpoint that does not exist is a ``NotFoundError``, refused
before anything is recorded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, NamedTuple
from uuid import UUID

from outbox.core.errors import BadRequestError, ConflictError, DatabaseError, NotFoundError
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
MAX_CANCELLED = 1000
# Ids an error names at most (the rest are counted).
NAMED_IDS = 5
# What an action's run does: on its connection, the rows it affected and its result.
Run = Callable[[Connection], Awaitable[tuple[int, dict[str, Any]]]]


class Actor(NamedTuple):
    """Who acts, as the record of actions names them: a console key's name, a principal's,
    ``function key``, ``cli``; over HTTP also the address and user agent they came with."""

    name: str
    address: str | None = None
    user_agent: str | None = None


# An actor, or only their name (a command's: ``cli``).
Who = Actor | str


def actor_of(who: Who) -> Actor:
    return who if isinstance(who, Actor) else Actor(who)


async def pause(
    conn: Connection, key: tuple[str, str], *, actor: Who, action_id: str | None = None
) -> dict[str, Any]:
    """Pause endpoint ``key`` for every relay: its deliveries wait, spending no attempt."""

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        name = actor_of(actor).name
        changed = bool(await sql.value(connection, "pause_endpoint", *key, name))
        return int(changed), {"paused": True, "changed": changed}

    return await act(conn, "pause", _key_filter(key), run, actor=actor, action_id=action_id)


async def resume(
    conn: Connection, key: tuple[str, str], *, actor: Who, action_id: str | None = None
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
    actor: Who,
    action_id: str | None = None,
) -> dict[str, Any]:
    """``operations.requeue``, recorded (a dry run changes nothing and is not recorded); ids
    that name no message are a ``NotFoundError``."""
    if wanted.message_ids:
        await known(conn, wanted.message_ids)
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
    actor: Who,
    action_id: str,
) -> dict[str, Any]:
    """One batch of a requeue recorded as ``action_id``: the first call records it, each call
    sets back at most ``batch_size`` more Failed rows, going on where the last batch ended, and
    answers with the running count (``requeued``), this call's (``batch_requeued``) and whether
    it is ``done``. A call repeated or retried goes on from the last batch that committed (no
    row is requeued twice under one action); one after the last batch requeues nothing."""
    checked = requests.parse(requests.RequeueRequest, asdict(wanted)).filter
    if checked.message_ids:
        await known(conn, checked.message_ids)
    shown = jsonable({k: v for k, v in asdict(checked).items() if v not in (None, False)})
    filter_json = json.dumps(shown)
    claimed = await claim(conn, action_id, "requeue", filter_json, actor_of(actor))
    if not claimed:
        earlier = await sql.row(conn, "show_action", action_id)
        if earlier is None:
            raise BadRequestError(f"action_id {action_id!r} was used for another action")
        check_same(earlier, "requeue", filter_json, action_id)
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
    actor: Who,
    action_id: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Send Processed messages again, with their own ids (the same ``webhook-id``): to
    ``endpoint`` alone (it must be one of the message's event type), or to every endpoint.
    A message that is not Processed is left as it is, listed under ``skipped`` and, with why,
    ``why_skipped``. Ids that name no message, or an endpoint none of their event types has,
    are a ``NotFoundError``; a dry run answers what would be resent (``would_resend``)."""
    if not message_ids or len(message_ids) > MAX_RESENT:
        raise BadRequestError(f"message_ids must list 1 to {MAX_RESENT} message ids")
    found = await known(conn, message_ids)
    if endpoint is not None:
        types = sorted({row["event_type"] for row in found.values()})
        if not any(endpoint in endpoints.get(t, ()) for t in types):
            raise NotFoundError(_no_endpoint(endpoint, types, endpoints))
    why = {
        str(i): reason
        for i in message_ids
        if (reason := _why_not_resent(found[i], endpoint, endpoints)) is not None
    }
    if dry_run:
        would = [str(i) for i in message_ids if str(i) not in why]
        return {"would_resend": would, "skipped": list(why), "why_skipped": why, "dry_run": True}

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        resent: list[str] = []
        skipped = dict(why)
        for message_id in message_ids:
            if str(message_id) in skipped:
                continue
            names = list(endpoints.get(found[message_id]["event_type"], ()))
            done = await sql.value(connection, "resend_processed", message_id, endpoint, names)
            if done is None:
                skipped[str(message_id)] = "no longer Processed"
            else:
                resent.append(str(message_id))
        result = {"resent": resent, "skipped": list(skipped), "why_skipped": skipped}
        return len(resent), result

    shown = {"message_ids": [str(i) for i in message_ids], "endpoint": endpoint}
    return await act(conn, "resend", shown, run, actor=actor, action_id=action_id)


def _why_not_resent(
    found: Mapping[str, Any], endpoint: str | None, endpoints: Endpoints
) -> str | None:
    if found["status"] != "Processed":
        advice = {"Failed": "requeue it instead", "Pending": "it is still to be delivered"}
        then = advice.get(found["status"], "it is being delivered")
        return f"it is {found['status']}, not Processed: {then}"
    names = endpoints.get(found["event_type"], ())
    if endpoint is not None and endpoint not in names:
        return f"endpoint {endpoint!r} is not one of event type {found['event_type']!r}'s"
    return None


async def cancel(
    conn: Connection,
    message_ids: Sequence[UUID],
    reason: str,
    *,
    actor: Who,
    action_id: str | None = None,
    dry_run: bool = False,
    hold_on_failure: bool = True,
) -> dict[str, Any]:
    """Cancel Pending messages: each becomes ``Failed``, its ``last_error`` ``cancelled by
    <actor>: <reason>`` (no status of its own: the four statuses stay the contract, and a
    requeue sends it after all). A message being delivered (``Processing``) or finished is left
    as it is, listed under ``skipped`` with why (``why_skipped``). Under
    ``OUTBOX_ORDERING_ON_FAILURE=release`` (``hold_on_failure`` false) the messages parked
    behind a cancelled one are let go; under ``hold`` they wait, as behind any Failed one."""
    if not message_ids or len(message_ids) > MAX_CANCELLED:
        raise BadRequestError(f"message_ids must list 1 to {MAX_CANCELLED} message ids")
    found = await known(conn, message_ids)
    why = {
        str(i): _why_not_cancelled(found[i]["status"])
        for i in message_ids
        if found[i]["status"] != "Pending"
    }
    if dry_run:
        would = [str(i) for i in message_ids if str(i) not in why]
        return {"would_cancel": would, "skipped": list(why), "why_skipped": why, "dry_run": True}
    error = f"cancelled by {actor_of(actor).name}: {reason}"

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        cancelled: list[str] = []
        skipped = dict(why)
        for message_id in message_ids:
            if str(message_id) in skipped:
                continue
            done = await sql.value(connection, "cancel_pending", message_id, error)
            if done is None:
                skipped[str(message_id)] = "no longer Pending: a relay took it meanwhile"
            else:
                cancelled.append(str(message_id))
        released = 0
        if cancelled and not hold_on_failure:
            released = len(await sql.rows(connection, "release_after_cancel", cancelled))
        result = {
            "cancelled": cancelled,
            "skipped": list(skipped),
            "why_skipped": skipped,
            "released": released,
        }
        return len(cancelled), result

    shown = {"message_ids": [str(i) for i in message_ids], "reason": reason}
    return await act(conn, "cancel", shown, run, actor=actor, action_id=action_id)


def _why_not_cancelled(status: str) -> str:
    if status == "Processing":
        return "it is being delivered now (Processing): only a Pending message is cancelled"
    return f"it is {status} already: only a Pending message is cancelled"


async def probe(
    conn: Connection, key: tuple[str, str], *, actor: Who, action_id: str | None = None
) -> dict[str, Any]:
    """Make endpoint ``key``'s breaker due for its probe now, and the messages waiting for the
    endpoint due now (the caller wakes a drain: its first delivery there is the probe, and a
    success closes the breaker). An endpoint whose breaker is not open is a ``ConflictError``."""
    if not await sql.value(conn, "breaker_is_open", *key):
        raise ConflictError(
            f"endpoint {key[1]!r} of event type {key[0]!r} has no open breaker: its messages "
            "are sent as they come due"
        )

    async def run(connection: Connection) -> tuple[int, dict[str, Any]]:
        row = await sql.row(connection, "probe_endpoint", *key)
        assert row is not None  # one row, open or not
        return int(row["due"]), {"probe_due": bool(row["probed"]), "due": int(row["due"])}

    return await act(conn, "probe", _key_filter(key), run, actor=actor, action_id=action_id)


async def begin(conn: Connection, action: str, filter_: dict[str, Any], actor: Who) -> str:
    """Record that ``action`` (one no id makes idempotent: a drain) starts now; its id, for
    ``finish``."""
    action_id = str(uuid.uuid4())
    await claim(conn, action_id, action, json.dumps(filter_), actor_of(actor))
    return action_id


async def finish(conn: Connection, action_id: str, affected: int, result: dict[str, Any]) -> None:
    """Record what the action ``begin`` recorded did, and that it has finished."""
    await sql.execute(
        conn, "finish_action", action_id, affected, json.dumps(jsonable(result)), True
    )


async def known(conn: Connection, message_ids: Sequence[UUID]) -> dict[UUID, dict[str, Any]]:
    """Each of ``message_ids``' status and event type; a ``NotFoundError`` naming those that
    name no message."""
    found = {
        row["outbox_message_id"]: row
        for row in await sql.rows(conn, "message_states", list(message_ids))
    }
    missing = [str(i) for i in dict.fromkeys(message_ids) if i not in found]
    if missing:
        named = ", ".join(missing[:NAMED_IDS])
        more = f" and {len(missing) - NAMED_IDS} more" if len(missing) > NAMED_IDS else ""
        raise NotFoundError(f"no outbox message {named}{more}")
    return found


def _no_endpoint(endpoint: str, event_types: Sequence[str], endpoints: Endpoints) -> str:
    configured = sorted({name for t in event_types for name in endpoints.get(t, ())})
    types = ", ".join(repr(t) for t in event_types)
    return f"no endpoint {endpoint!r} of event type {types} (configured: {', '.join(configured)})"


async def act(
    conn: Connection,
    action: str,
    filter_: dict[str, Any],
    run: Run,
    *,
    actor: Who,
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
    async with acquired(conn) as connection, running_action(connection, action_id) as running:
        earlier = await sql.row(connection, "show_action", action_id)
        if earlier is not None:
            check_same(earlier, action, filter_json, action_id)
            if earlier["result"] is not None:
                result = json.loads(earlier["result"])
                return {**result, "action_id": action_id, "repeated": True}
        if not running:
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        claimed = earlier is not None or await claim(
            connection, action_id, action, filter_json, actor_of(actor)
        )
        if not claimed:
            # recorded meanwhile by a call that takes no lock: a requeue in batches
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        if not atomic:
            return await _run(connection, action_id, run)
        return await _run_atomically(connection, action_id, run)


async def claim(
    conn: Connection, action_id: str, action: str, filter_json: str, actor: Actor
) -> bool:
    """Record an action before it is done; False when an action of that id was recorded."""
    claimed = await sql.row(conn, "claim_action", action_id, action, filter_json, False, *actor)
    return claimed is not None


async def _run(connection: Connection, action_id: str, run: Run) -> dict[str, Any]:
    affected, result = await run(connection)
    await sql.execute(connection, "finish_action", action_id, affected, json.dumps(result), True)
    return {**result, "action_id": action_id, "repeated": False}


@database_boundary
async def _run_atomically(connection: Connection, action_id: str, run: Run) -> dict[str, Any]:
    """``_run`` in one transaction: the action's writes and its result commit together."""
    async with transaction(connection) as same:
        return await _run(same, action_id, run)


def check_same(earlier: Mapping[str, Any], action: str, filter_json: str, action_id: str) -> None:
    """An action id names one action on one filter: reused for another, it is refused."""
    if earlier["action"] != action:
        raise BadRequestError(f"action_id {action_id!r} was used for another action")
    if json.loads(earlier["filter"]) != json.loads(filter_json):
        raise BadRequestError(f"action_id {action_id!r} was used for another filter")


@asynccontextmanager
async def running_action(connection: Connection, action_id: str) -> AsyncIterator[bool]:
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
