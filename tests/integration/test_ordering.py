"""Per-aggregate ordering: same-key messages one at a time in enqueue order; others in parallel."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

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
        await eventually(lambda: _true(receiver.in_flight == 5))
        keyed_in_flight = [r for r in receiver.requests if "order-1" in str(r.body)]
        release.set()
        await drain
    assert len(keyed_in_flight) <= 1
    assert receiver.max_in_flight == 5  # four unkeyed plus the head of the key


async def _true(value: bool) -> bool:
    return value


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
    plan = str(await db.fetchval(query, 10, 30.0, True, 1024))
    assert "outbox_messages_due_idx" in plan
    assert "outbox_messages_ordering_idx" in plan
    assert "Seq Scan" not in plan
