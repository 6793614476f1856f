"""Per-aggregate ordering: same-key messages one at a time in enqueue order; others in parallel."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from typing import Any

import pytest

import outbox
from outbox import operations
from outbox.store import QUERIES
from tests.support.outbox_helpers import eventually, open_relay, statuses
from tests.support.receiver import Received, Receiver, Reply

KEYS = [f"order-{n}" for n in range(6)]
PER_KEY = 5


async def enqueue_keyed(db: Any, key: str, index: int) -> None:
    async with db.transaction():
        await outbox.enqueue(db, "OrderCompleted", {"key": key, "n": index}, ordering_key=key)


async def test_same_key_messages_are_delivered_in_order_across_failures_and_relays(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Enqueue interleaved across keys, as concurrent business transactions would.
    for index in range(PER_KEY):
        for key in KEYS:
            await enqueue_keyed(db, key, index)
    async with db.transaction():
        for n in range(10):
            await outbox.enqueue(db, "OrderCompleted", {"key": None, "n": n})

    def flaky(request: Received) -> Reply:
        # The first attempt of every third message fails and asks for a retry a second later.
        body = request.json
        first = sum(1 for r in receiver.requests if r.webhook_id == request.webhook_id) == 1
        if first and body["data"]["n"] % 3 == 0:
            return Reply(503, b"try later", headers={"Retry-After": "1"})
        return Reply(200)

    receiver.responder = flaky
    settings = make_settings(batch_size=4, concurrency=4)
    async with open_relay(settings) as a, open_relay(settings) as b, open_relay(settings) as c:

        async def keep_draining(relay: Any) -> None:
            while (await statuses(relay.pool)).get("Processed", 0) < len(KEYS) * PER_KEY + 10:
                await relay.processor.execute()
                await asyncio.sleep(0.05)

        await asyncio.wait_for(asyncio.gather(*(keep_draining(r) for r in (a, b, c))), timeout=120)

    by_key: dict[str, list[Received]] = defaultdict(list)
    for request in receiver.requests:
        by_key[str(request.json["data"]["key"])].append(request)
    for key in KEYS:
        requests = by_key[key]
        # Arrival order at the receiver never goes back to an earlier message of the key...
        order = [r.json["data"]["n"] for r in requests]
        assert order == sorted(order), (key, order)
        # ...and a message is first sent only after the one before it succeeded.
        assert [n for n in dict.fromkeys(order)] == list(range(PER_KEY))
    retried = [r for r in receiver.requests if r.json["data"]["n"] % 3 == 0]
    assert len(retried) > len({r.webhook_id for r in retried})  # failures really happened
    assert await statuses(db) == {"Processed": len(KEYS) * PER_KEY + 10}


async def test_unkeyed_messages_keep_full_parallelism_but_a_key_goes_one_at_a_time(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    async with db.transaction():
        for n in range(4):
            await outbox.enqueue(db, "OrderCompleted", {"n": n})
        for n in range(4):
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key="order-1")
    async with open_relay(make_settings(concurrency=8)) as relay:
        drain = asyncio.create_task(relay.processor.execute())
        await eventually(lambda: receiver.in_flight == 5)
        keyed_in_flight = [r for r in receiver.requests if "order-1" in str(r.body)]
        release.set()
        await drain
    assert len(keyed_in_flight) <= 1
    assert receiver.max_in_flight == 5  # four unkeyed plus the head of the key


async def failed_head(db: Any, receiver: Receiver, relay: Any) -> None:
    """order-9: the first message fails for good (410); two more wait behind it."""
    receiver.script("/orders", Reply(410, b"gone"))
    for n in range(3):
        await enqueue_keyed(db, "order-9", n)
    await relay.processor.execute()


async def test_a_failed_message_holds_its_key_until_it_is_requeued(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    async with open_relay(make_settings()) as relay:
        await failed_head(db, receiver, relay)
        assert await statuses(db) == {"Failed": 1, "Pending": 2}
        assert len(receiver.requests) == 1
        report = await operations.requeue(
            db, operations.RequeueFilter(all_failed=True), dry_run=False
        )
        assert report.requeued == 1
        await relay.processor.execute()
        await relay.processor.execute()
    assert await statuses(db) == {"Processed": 3}
    assert [r.json["data"]["n"] for r in receiver.requests] == [0, 0, 1, 2]


async def test_release_policy_lets_later_messages_pass_a_failed_one(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    async with open_relay(make_settings(ordering_on_failure="release")) as relay:
        await failed_head(db, receiver, relay)
        await relay.processor.execute()
        await relay.processor.execute()
    assert await statuses(db) == {"Failed": 1, "Processed": 2}
    assert [r.json["data"]["n"] for r in receiver.requests] == [0, 1, 2]


async def test_lease_with_ordering_keys_still_uses_indexes(db: Any) -> None:
    await db.execute(
        "INSERT INTO outbox_messages "
        "(outbox_message_id, event_type, payload, status, processed_at) "
        "SELECT gen_random_uuid(), 'X', '{}', 'Processed', now() FROM generate_series(1, 20000)"
    )
    async with db.transaction():
        for n in range(200):
            await outbox.enqueue(db, "X", {"n": n}, ordering_key=f"k{n % 20}")
    await db.execute("ANALYZE outbox_messages")
    query = "EXPLAIN (FORMAT JSON) " + QUERIES["lease_batch"]
    plan = str(await db.fetchval(query, 30.0, True, 1024, 10))
    assert "outbox_messages_due_idx" in plan
    assert "outbox_messages_ordering_idx" in plan
    # No scan of the messages table (the breakers' few rows are read whole, as they should be).
    assert not re.search(r'"Seq Scan",[^}]*"Relation Name": "outbox_messages"', plan)


# Keys whose first message is Failed for good and `behind` Pending messages wait after it, as a
# busy key leaves them; written in one statement, in key order within each key.
HELD_KEYS = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             last_error, ordering_key, ordering_seq, created_at, next_attempt_at)
SELECT gen_random_uuid(), 'OrderCompleted', jsonb_build_object('key', k, 'n', n),
       CASE WHEN n = 0 THEN 'Failed' ELSE 'Pending' END, CASE WHEN n = 0 THEN 10 ELSE 0 END,
       CASE WHEN n = 0 THEN 'HTTP 400' END, 'held-' || k,
       nextval('outbox_messages_ordering_seq'), now() - interval '1 hour',
       now() - interval '1 hour'
FROM (SELECT k, n FROM generate_series(1, $1) AS k, generate_series(0, $2) AS n
      ORDER BY n, k) AS rows
"""


async def hold_keys(db: Any, keys: int, behind: int) -> None:
    await db.execute(HELD_KEYS, keys, behind)


async def parked(db: Any) -> int:
    count: int = await db.fetchval(
        "SELECT count(*) FROM outbox_messages WHERE next_attempt_at = 'infinity'"
    )
    return count


def due_index_reads(plan: dict[str, Any]) -> int:
    """Rows the lease's scan of the due index read: those it returned and those it filtered."""
    node_reads = 0
    if plan.get("Index Name") == "outbox_messages_due_idx":
        node_reads = plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)
    return node_reads + sum(due_index_reads(child) for child in plan.get("Plans", []))


async def test_rows_behind_held_keys_are_parked_and_no_later_lease_reads_them(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await hold_keys(db, keys=100, behind=30)
    async with db.transaction():
        for n in range(20):
            await outbox.enqueue(db, "OrderCompleted", {"n": n})
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 20
    assert await parked(db) == 3000
    async with db.transaction():
        for n in range(10):
            await outbox.enqueue(db, "OrderCompleted", {"n": n})
    await db.execute("ANALYZE outbox_messages")
    tx = db.transaction()
    await tx.start()
    try:
        raw = await db.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + QUERIES["lease_batch"], 30.0, True, 1024, 100
        )
    finally:
        await tx.rollback()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    # The ten new rows, not the 3,000 that wait (every lease used to read each of them).
    assert due_index_reads(plan) == 10


async def test_a_parked_message_goes_once_the_message_before_it_is_delivered(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    async with open_relay(make_settings()) as relay:
        await failed_head(db, receiver, relay)
        assert await parked(db) == 2
        await operations.requeue(db, operations.RequeueFilter(all_failed=True), dry_run=False)
        summary = await relay.processor.execute()
    assert summary.processed == 3
    assert await parked(db) == 0
    assert [r.json["data"]["n"] for r in receiver.requests] == [0, 0, 1, 2]


async def test_messages_behind_a_backing_off_message_wait_parked_until_it_is_delivered(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(503, b"later", headers={"Retry-After": "1"}))
    for n in range(3):
        await enqueue_keyed(db, "order-7", n)
    async with open_relay(make_settings()) as relay:
        first = await relay.processor.execute()
        assert (first.retried, await parked(db)) == (1, 2)
        await asyncio.sleep(1.1)
        again = await relay.processor.execute(until_caught_up=True)
    # A hint's run follows the key: each delivery lets the next message go, due at once.
    assert (again.processed, again.stopped_by) == (3, "drained")
    assert [r.json["data"]["n"] for r in receiver.requests] == [0, 0, 1, 2]


async def test_rows_behind_held_keys_never_hold_up_other_messages(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await hold_keys(db, keys=4, behind=50)  # older than everything below, so scanned first
    async with db.transaction():
        for n in range(5):
            await outbox.enqueue(db, "OrderCompleted", {"n": n})
        for n in range(3):
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key="free-key")
    async with open_relay(make_settings(batch_size=10)) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 8
    assert await parked(db) == 200


@pytest.mark.parametrize("change", ["deleted-by-hand", "purged", "policy-now-release"])
async def test_a_sweep_lets_go_what_a_change_outside_the_relay_left_parked(
    db: Any, receiver: Receiver, make_settings: Any, change: str
) -> None:
    async with open_relay(make_settings()) as relay:
        await failed_head(db, receiver, relay)
    assert await parked(db) == 2
    settings = make_settings()
    if change == "deleted-by-hand":
        await db.execute("DELETE FROM outbox_messages WHERE status = 'Failed'")
    elif change == "purged":
        await db.execute("UPDATE outbox_messages SET created_at = now() - interval '40 days'")
        report = await operations.purge(
            db, retention_days=7, failed_retention_days=30, batch_size=100
        )
        assert report.failed_deleted == 1
    else:
        settings = make_settings(ordering_on_failure="release")
    async with open_relay(settings) as relay:
        hint = await relay.processor.execute(until_caught_up=True)
        assert hint.leased == 0  # a hint's run does not sweep
        summary = await relay.processor.execute()
    assert summary.processed == 2
    assert [r.json["data"]["n"] for r in receiver.requests] == [0, 1, 2]
