"""A console action's id makes retries safe: the same answer once the first call has finished, a
409 while another call runs it, and an action whose first call ended without a result (its
session terminated while it waited on a row lock: 503) is run again by the next call; a replay
so interrupted goes on after its last batch that committed."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import azure.functions as func
import pytest

from outbox.azure import functions
from outbox.operations import replay_window
from tests.support.outbox_helpers import eventually, row, seed, statuses
from tests.support.receiver import Receiver

KEY = {"x-functions-key": "the-operators-key-0123"}


def post(route: str, body: dict[str, Any]) -> Any:
    return func.HttpRequest(
        method="POST",
        url=f"http://localhost/api/{route}",
        headers=KEY,
        params={},
        body=json.dumps(body).encode(),
    )


async def resend(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = await functions.outbox_resend(post("outbox/resend", body))
    return response.status_code, json.loads(response.get_body())


async def delivered_once(db: Any) -> uuid.UUID:
    """A message the receiver has had, Processed: one that may be resent."""
    [message_id] = await seed(db)
    await functions.outbox_drain(post("outbox/drain", {}))
    assert (await row(db, message_id))["status"] == "Processed"
    return message_id


@asynccontextmanager
async def row_locked(database_url: str, message_id: uuid.UUID) -> AsyncIterator[Any]:
    """Another session holding the message's row lock until the block ends."""
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM outbox_messages WHERE outbox_message_id = $1 FOR UPDATE",
                message_id,
            )
            yield holder
    finally:
        await holder.close()


async def waiting_on(db: Any, holder: Any) -> int:
    """The pid of the session that waits for ``holder``'s lock, once one does."""
    found: list[Any] = []

    async def waits() -> bool:
        found[:] = await db.fetch(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
            holder.get_server_pid(),
        )
        return bool(found)

    await eventually(waits)
    [waiter] = found
    return int(waiter["pid"])


async def action_rows(db: Any) -> list[Any]:
    return list(
        await db.fetch(
            "SELECT action_id, affected, result FROM outbox_console_actions "
            "WHERE action <> 'drain'"  # the drains that delivered the messages, recorded too
        )
    )


async def test_a_resend_whose_first_call_answered_503_is_run_again_by_its_retry(
    db: Any, database_url: str, app_env: None, receiver: Receiver
) -> None:
    message_id = await delivered_once(db)
    body = {"message_ids": [str(message_id)], "action_id": "resend-after-503"}
    async with row_locked(database_url, message_id) as holder:
        first = asyncio.create_task(resend(body))
        # The call waits on the row lock; its session is ended (as a failover or an
        # administrator would): the call answers 503, and nothing of it stays done.
        await db.execute("SELECT pg_terminate_backend($1)", await waiting_on(db, holder))
        assert await first == (503, {"error": "database error; see the function logs"})
    assert (await row(db, message_id))["status"] == "Processed"
    assert [(r["action_id"], r["result"]) for r in await action_rows(db)] == [
        ("resend-after-503", None)
    ]
    done = {
        "resent": [str(message_id)],
        "skipped": [],
        "why_skipped": {},
        "action_id": "resend-after-503",
    }
    assert await resend(body) == (200, done | {"repeated": False})  # run again, and done
    assert (await row(db, message_id))["status"] == "Pending"
    assert await resend(body) == (200, done | {"repeated": True})
    [recorded] = await action_rows(db)
    assert (recorded["affected"], json.loads(recorded["result"])) == (
        1,
        {"resent": [str(message_id)], "skipped": [], "why_skipped": {}},
    )
    await functions.outbox_drain(post("outbox/drain", {}))
    assert [r.webhook_id for r in receiver.to("/orders")] == [str(message_id)] * 2


async def test_two_calls_at_once_with_one_new_action_id_run_it_once(
    db: Any, database_url: str, app_env: None, receiver: Receiver
) -> None:
    message_id = await delivered_once(db)
    body = {"message_ids": [str(message_id)], "action_id": "double-click"}
    async with row_locked(database_url, message_id) as holder:
        calls = [asyncio.create_task(resend(body)) for _ in range(2)]
        await waiting_on(db, holder)  # one call runs the action, and waits on the row lock
        # The other call does not wait for it: a 409 naming the id, with nothing done. (The
        # deadline only keeps a regression from hanging the suite.)
        finished, running = await asyncio.wait(
            calls, timeout=15, return_when=asyncio.FIRST_COMPLETED
        )
        [(status, refused)] = [call.result() for call in finished]
        assert (status, refused["in_progress"], refused["action_id"]) == (
            409,
            True,
            "double-click",
        )
        assert "is running in another call" in refused["error"]
        assert (await row(db, message_id))["status"] == "Processed"
    [ran] = running
    done = {
        "resent": [str(message_id)],
        "skipped": [],
        "why_skipped": {},
        "action_id": "double-click",
    }
    assert await ran == (200, done | {"repeated": False})
    # Sent again once it has finished, the refused call gets the same answer.
    assert await resend(body) == (200, done | {"repeated": True})
    assert len(await action_rows(db)) == 1
    await functions.outbox_drain(post("outbox/drain", {}))
    assert [r.webhook_id for r in receiver.to("/orders")] == [str(message_id)] * 2


async def test_a_repeated_action_answers_the_same_and_does_nothing_more(
    db: Any, app_env: None, receiver: Receiver
) -> None:
    message_id = await delivered_once(db)
    body = {"message_ids": [str(message_id)], "action_id": "repeat"}
    first = await resend(body)
    await functions.outbox_drain(post("outbox/drain", {}))  # delivered again: Processed
    again = await resend(body)
    done = {"resent": [str(message_id)], "skipped": [], "why_skipped": {}, "action_id": "repeat"}
    assert first == (200, done | {"repeated": False})
    assert again == (200, first[1] | {"repeated": True})
    assert (await row(db, message_id))["status"] == "Processed"  # not resent a second time
    assert [r.webhook_id for r in receiver.to("/orders")] == [str(message_id)] * 2
    # The id names that action on that filter: reused for another, it is refused.
    another = await delivered_once(db)
    other = await resend({"message_ids": [str(another)], "action_id": "repeat"})
    assert other == (400, {"error": "action_id 'repeat' was used for another filter"})
    paused = await functions.outbox_pause(
        post("outbox/pause", {"event_type": "OrderCompleted", "action_id": "repeat"})
    )
    assert paused.status_code == 400
    assert await db.fetchval("SELECT count(*) FROM outbox_paused_endpoints") == 0


async def test_a_requeue_in_batches_recorded_without_progress_goes_on_when_called_again(
    db: Any, app_env: None
) -> None:
    ids = await seed(db, 3)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', last_error = 'HTTP 504: timeout' "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids,
    )
    # A call recorded the action and ended before writing its first progress.
    await db.execute(
        "INSERT INTO outbox_console_actions (action_id, action, filter, actor) "
        "VALUES ('batches', 'requeue', '{\"error\": \"504\"}', 'key:0123456789ab')"
    )
    body = {"error": "504", "action_id": "batches", "batch_size": 2}
    response = await functions.outbox_requeue(post("outbox/requeue", body))
    shown = json.loads(response.get_body())
    assert (response.status_code, shown["requeued"], shown["done"]) == (200, 2, False)
    response = await functions.outbox_requeue(post("outbox/requeue", body))
    shown = json.loads(response.get_body())
    assert (shown["requeued"], shown["batch_requeued"], shown["done"]) == (3, 1, True)
    assert await db.fetchval("SELECT count(*) FROM outbox_messages WHERE status = 'Pending'") == 3


async def test_a_replay_interrupted_between_batches_goes_on_where_it_stopped_when_sent_again(
    db: Any,
    database_url: str,
    app_env: None,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replay_window, "BATCH", 2)
    ids = await seed(db, 6)
    await db.execute(  # one creation time each, in the order of the list: batches of two
        "UPDATE outbox_messages AS m SET created_at = now() - make_interval(mins => (10 - n)::int) "
        "FROM unnest($1::uuid[]) WITH ORDINALITY AS o(id, n) WHERE m.outbox_message_id = o.id",
        ids,
    )
    await functions.outbox_drain(post("outbox/drain", {}))
    window = {
        "created_from": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
        "created_to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
        "action_id": "replay-after-503",
    }

    async def replay() -> tuple[int, dict[str, Any]]:
        response = await functions.outbox_replay(post("outbox/replay", window))
        return response.status_code, json.loads(response.get_body())

    async with row_locked(database_url, ids[2]) as holder:
        first = asyncio.create_task(replay())
        # The second batch waits on a row lock; the call's session is ended meanwhile.
        await db.execute("SELECT pg_terminate_backend($1)", await waiting_on(db, holder))
        assert await first == (503, {"error": "database error; see the function logs"})
    [recorded] = await action_rows(db)
    progress = json.loads(recorded["result"])
    assert (progress["resent"], progress["batches"], progress["done"]) == (2, 1, False)
    assert await statuses(db) == {"Pending": 2, "Processed": 4}
    await functions.outbox_drain(post("outbox/drain", {}))  # the first batch delivered again
    assert await statuses(db) == {"Processed": 6}
    status, done = await replay()  # the same call, sent again: it goes on after the first batch
    assert status == 200, done
    assert (done["resent"], done["total"], done["done"], done["repeated"]) == (6, 6, True, False)
    assert await statuses(db) == {"Processed": 2, "Pending": 4}
    await functions.outbox_drain(post("outbox/drain", {}))
    delivered = [r.webhook_id for r in receiver.to("/orders")]
    assert sorted(delivered) == sorted([str(i) for i in ids] * 2)  # each replayed exactly once
