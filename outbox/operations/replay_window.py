"""A replay: the Processed messages of a window of creation times sent again (``python -m outbox
replay``, ``POST /api/outbox/replay``), to every endpoint or to one, each with its own id (the
same ``webhook-id``), at most ``MAX_REPLAYED`` per action.

A dry run says how many and which first. The replay itself is recorded as an action and runs in
batches of ``BATCH`` in (created_at, id) order, each batch and the action's progress committed
together under the action's row lock: a call interrupted and sent again with the same
``action_id`` goes on after the last batch that committed, and no message is resent twice under
one action.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from outbox.core.errors import BadRequestError, NotFoundError
from outbox.operations import actions, sql
from outbox.operations.requests import Endpoints, ReplayRequest
from outbox.operations.views import jsonable
from outbox.store.connection import Connection, acquired, database_boundary, transaction

MAX_REPLAYED = 10_000
BATCH = 500
SAMPLE = 10
# A window is counted up to this many, then said to hold more.
COUNTED = 100_000


def selection(wanted: ReplayRequest, endpoints: Endpoints) -> tuple[Any, ...]:
    """``replay_plan``'s and ``replay_batch``'s $1…$4 for ``wanted``: an event type or an
    endpoint that is not configured is a ``NotFoundError``."""
    configured = sorted(endpoints)
    if wanted.event_type is not None and wanted.event_type not in endpoints:
        raise NotFoundError(
            f"no endpoint of event type {wanted.event_type!r} "
            f"(configured: {', '.join(configured) or 'none'})"
        )
    having = None
    if wanted.endpoint is not None:
        types = [wanted.event_type] if wanted.event_type else configured
        having = [t for t in types if wanted.endpoint in endpoints[t]]
        if not having:
            names = sorted({n for t in types for n in endpoints[t]})
            where = f" of event type {wanted.event_type!r}" if wanted.event_type else ""
            raise NotFoundError(
                f"no endpoint {wanted.endpoint!r}{where} (configured: {', '.join(names)})"
            )
    return wanted.created_from, wanted.created_to, wanted.event_type, having


async def plan(conn: Connection, wanted: ReplayRequest, endpoints: Endpoints) -> dict[str, Any]:
    """What the replay would resend: how many (``would_resend``) and the first ones
    (``sample``); a window of more than ``MAX_REPLAYED`` is a ``BadRequestError`` saying how
    many it holds."""
    row = await sql.row(conn, "replay_plan", *selection(wanted, endpoints), COUNTED + 1, SAMPLE)
    assert row is not None  # one row, whatever matched
    total = int(row["total"])
    if total > MAX_REPLAYED:
        held = f"more than {COUNTED:,}" if total > COUNTED else f"{total:,}"
        raise BadRequestError(
            f"the window holds {held} Processed messages; a replay resends at most "
            f"{MAX_REPLAYED:,}: narrow the window (created_from/created_to) or the filter"
        )
    return {
        "would_resend": total,
        "sample": [str(i) for i in row["sample"]],
        "endpoints": _endpoints_of(wanted, endpoints),
        "dry_run": True,
    }


async def replay(
    conn: Connection,
    wanted: ReplayRequest,
    endpoints: Endpoints,
    *,
    actor: actions.Who,
) -> dict[str, Any]:
    """Resend the window's Processed messages, recorded as ``wanted.action_id`` (a new id when
    none): the first call plans it (refused over ``MAX_REPLAYED``), records it and resends it
    batch after batch; a call with the id of one interrupted goes on where it stopped, one with
    the id of one done answers its result (``repeated``), one while another call runs it
    ``in_progress``."""
    if wanted.dry_run:
        return await plan(conn, wanted, endpoints)
    chosen = selection(wanted, endpoints)
    action_id = wanted.action_id or str(uuid.uuid4())
    shown = jsonable(
        {k: v for k, v in wanted.model_dump().items() if v is not None and k != "action_id"}
    )
    shown.pop("dry_run", None)
    filter_json = json.dumps(shown)
    async with (
        acquired(conn) as connection,
        actions.running_action(connection, action_id) as running,
    ):
        if not running:
            return {"action_id": action_id, "in_progress": True, "repeated": True}
        earlier = await sql.row(connection, "show_action", action_id)
        total = None
        if earlier is not None:
            actions.check_same(earlier, "replay", filter_json, action_id)
        else:
            total = (await plan(connection, wanted, endpoints))["would_resend"]
            await actions.claim(
                connection, action_id, "replay", filter_json, actions.actor_of(actor)
            )
        # Its first progress, unless it has some: written apart from the claim, so that a call
        # that ended between the two leaves an action the next call goes on with.
        fresh = {"resent": 0, "total": total, "batches": 0, "done": False, "after": None}
        await sql.execute(connection, "start_action", action_id, json.dumps(fresh))
        names = json.dumps({t: list(n) for t, n in endpoints.items()})
        progress, stepped = None, False
        while progress is None or not progress["done"]:
            progress, moved = await step(connection, action_id, chosen, wanted.endpoint, names)
            stepped = stepped or moved
    return {**progress, "action_id": action_id, "repeated": not stepped}


@database_boundary
async def step(
    conn: Connection,
    action_id: str,
    chosen: tuple[Any, ...],
    endpoint: str | None,
    names: str,
) -> tuple[dict[str, Any], bool]:
    """The next batch of replay ``action_id`` after where its progress says the last one ended,
    and its progress, committed together under the action's row lock; whether a batch ran (a
    replay done already runs none)."""
    async with transaction(conn) as connection:
        row = await sql.row(connection, "lock_action", action_id)
        assert row is not None  # recorded (replay claims it first)
        assert row["result"] is not None  # and started (start_action)
        progress: dict[str, Any] = json.loads(row["result"])
        if progress.get("done", True):
            return progress, False
        last = progress["after"]
        after = (datetime.fromisoformat(last[0]), UUID(last[1])) if last else (None, None)
        batch = await sql.row(connection, "replay_batch", *chosen, *after, BATCH, endpoint, names)
        assert batch is not None  # one row, whatever it read
        if batch["created_at"] is not None:
            last = [batch["created_at"].isoformat(), str(batch["outbox_message_id"])]
        progress = {
            **progress,
            "resent": progress["resent"] + int(batch["resent"]),
            "batches": progress["batches"] + 1,
            "done": int(batch["read"]) < BATCH,
            "after": last,
        }
        await sql.execute(
            connection,
            "finish_action",
            action_id,
            progress["resent"],
            json.dumps(progress),
            progress["done"],
        )
    return progress, True


def _endpoints_of(wanted: ReplayRequest, endpoints: Endpoints) -> list[str]:
    """The endpoints the replay sends to."""
    if wanted.endpoint is not None:
        return [wanted.endpoint]
    types = [wanted.event_type] if wanted.event_type else list(endpoints)
    return sorted({name for t in types for name in endpoints.get(t, ())})
