"""Relay processes racing over ordering keys whose messages fail, back off and are requeued:
parking and letting go never strand a message, and each key's order holds."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Any

import asyncpg
import pytest

import outbox
from outbox import operations
from outbox.store.contract import Lease
from outbox.store.postgres import PostgresStore, lease_statement
from tests.support.outbox_helpers import statuses
from tests.support.receiver import Received, Receiver, Reply
from tests.support.relay_process import RelayProcess, relay_env

KEYS = 40
PER_KEY = 15
UNKEYED = 100
RELAYS = 3
TOTAL = KEYS * PER_KEY + UNKEYED


class FlakyFirstAttempts:
    """Answers first attempts badly: every fifth message backs off a second, some fail for good
    (410, which holds the key until requeued); later attempts succeed. It notes any message of
    a key sent before every earlier one of that key was accepted.

    The messages that back off are spread over the keys (never ten in a row in the order they
    were written), so the endpoint's breaker stays shut: its cool-downs, doubling at each failed
    probe, would time the test instead of the parking it is about."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = defaultdict(int)
        self.accepted: dict[Any, set[int]] = defaultdict(set)
        self.out_of_order: list[tuple[Any, int]] = []

    def __call__(self, request: Received) -> Reply:
        self.attempts[request.webhook_id] += 1
        first = self.attempts[request.webhook_id] == 1
        key, n = request.json["data"]["key"], request.json["data"]["n"]
        if key is not None and not self.accepted[key] >= set(range(n)):
            self.out_of_order.append((key, n))
        if first and (n + (key or 0)) % 5 == 0:
            return Reply(503, headers={"Retry-After": "1"})
        if first and n % 7 == 3:
            return Reply(410)
        if key is not None:
            self.accepted[key].add(n)
        return Reply(200)


async def enqueue_all(db: Any) -> None:
    async with db.transaction():
        for n in range(PER_KEY):
            for k in range(KEYS):
                payload = {"key": k, "n": n}
                await outbox.enqueue(db, "OrderCompleted", payload, ordering_key=f"order-{k}")
        for n in range(UNKEYED):
            await outbox.enqueue(db, "OrderCompleted", {"key": None, "n": n})


async def delivered_all(pool: Any) -> bool:
    return (await statuses(pool)).get("Processed", 0) == TOTAL


@pytest.mark.slow
async def test_racing_relays_keep_each_key_in_order_and_strand_nothing_behind_held_keys(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    await enqueue_all(db)
    answers = receiver.responder = FlakyFirstAttempts()
    env = relay_env(database_url, webhooks, batch_size=20, concurrency=8)
    pool = await asyncpg.create_pool(database_url, min_size=0, max_size=4)

    async def keep_draining() -> None:
        while not await delivered_all(pool):
            assert (await (await RelayProcess(env).start()).wait()).returncode == 0

    async def keep_requeuing() -> None:
        while not await delivered_all(pool):
            everything = operations.RequeueFilter(all_failed=True)
            await operations.requeue(pool, everything, dry_run=False)
            await asyncio.sleep(0.3)

    try:
        racing = [keep_requeuing(), *(keep_draining() for _ in range(RELAYS))]
        await asyncio.wait_for(asyncio.gather(*racing), 240)
    finally:
        await pool.close()
    assert await statuses(db) == {"Processed": TOTAL}
    parked = "SELECT count(*) FROM outbox_messages WHERE next_attempt_at = 'infinity'"
    assert await db.fetchval(parked) == 0
    assert answers.out_of_order == []
    assert all(answers.accepted[key] == set(range(PER_KEY)) for key in range(KEYS))
    # The failures really happened: many messages took more than one attempt.
    assert sum(count > 1 for count in answers.attempts.values()) > KEYS * PER_KEY // 5


# A backlog no relay has seen: `behind` Pending rows after each of `keys` Failed heads, older
# than everything else, so every scan of the due index meets them first.
HELD_BACKLOG = """
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
# Twice what one lease parks (10,000): the backlog is still being parked after the first lease.
HELD_KEYS, HELD_BEHIND = 4, 5_000
PARKED_BY_A_LEASE = 10_000


async def lease(db: Any, *, skip: tuple[str, ...] = ()) -> Lease:
    return await PostgresStore(db).lease_batch(100, 60.0, usual_size=100, skip=skip)


async def test_messages_beside_a_held_backlog_are_leased_by_the_first_leases(db: Any) -> None:
    await db.execute(HELD_BACKLOG, HELD_KEYS, HELD_BEHIND)
    unkeyed, keyed = set(), set()
    async with db.transaction():
        for n in range(50):
            unkeyed.add(await outbox.enqueue(db, "OrderCompleted", {"n": n}))
            keyed.add(await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key=f"k{n}"))
    await db.execute("ANALYZE outbox_messages")
    parked = "SELECT count(*) FROM outbox_messages WHERE next_attempt_at = 'infinity'"

    # The first lease takes every message without a key (from their own index) and the first
    # message of every other key (before: none of them, it parked 100 held rows and was full;
    # then the keyed ones waited until the whole backlog was parked), and parks the 100 held
    # rows its scan met and 10,000 more queued behind them in bulk.
    first = await lease(db)
    assert {m.message_id for m in first.messages} == unkeyed | keyed
    assert first.parked == 100 + PARKED_BY_A_LEASE
    assert await db.fetchval(parked) == first.parked
    # The next one parks the rest of the backlog, and then nothing is left.
    second = await lease(db)
    assert (second.messages, second.parked) == ([], HELD_KEYS * HELD_BEHIND - first.parked)
    assert await db.fetchval(parked) == HELD_KEYS * HELD_BEHIND
    assert (await lease(db)).taken == 0


async def test_the_first_messages_of_other_keys_beside_a_held_backlog_keep_their_order(
    db: Any,
) -> None:
    """Beside a backlog being parked, a lease takes one message of another key, its first, and
    none of a key whose first is Failed (hold) or backing off; a lease that reads past some
    event types skips theirs."""
    await db.execute(HELD_BACKLOG, HELD_KEYS, HELD_BEHIND)
    async with db.transaction():
        firsts = {await outbox.enqueue(db, "OrderCompleted", {"n": 0}, ordering_key="k")}
        await outbox.enqueue(db, "OrderCompleted", {"n": 1}, ordering_key="k")
        backing_off = await outbox.enqueue(db, "OrderCompleted", {"n": 0}, ordering_key="later")
        await outbox.enqueue(db, "OrderCompleted", {"n": 1}, ordering_key="later")
        skipped = await outbox.enqueue(db, "OrderShipped", {"n": 0}, ordering_key="shipped")
    await db.execute(
        "UPDATE outbox_messages SET next_attempt_at = now() + interval '1 hour' "
        "WHERE outbox_message_id = $1",
        backing_off,
    )
    await db.execute("ANALYZE outbox_messages")

    first = await lease(db, skip=("OrderShipped",))
    assert {m.message_id for m in first.messages} == firsts
    assert first.parked > 0
    # Once the first of "k" is in flight, the next lease takes nothing more of that key.
    second = await lease(db)
    assert {m.message_id for m in second.messages} == {skipped}


async def test_under_release_the_message_after_a_failed_one_goes_beside_a_held_backlog(
    db: Any,
) -> None:
    await db.execute(HELD_BACKLOG, HELD_KEYS, HELD_BEHIND)
    async with db.transaction():
        ids = [
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key="k") for n in range(3)
        ]
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed' WHERE outbox_message_id = $1", ids[0]
    )
    await db.execute("ANALYZE outbox_messages")

    first = await PostgresStore(db).lease_batch(100, 60.0, hold_on_failure=False, usual_size=100)
    # Release: a Failed message lets the rest of its key go, one at a time.
    leased = {m.message_id for m in first.messages}
    assert ids[1] in leased
    assert ids[2] not in leased
    assert first.parked > 0


def keys_visited(plan: dict[str, Any]) -> int:
    """Keys the lease's loose scan of the ordering index visited (its recursive union's rows)."""
    visited = plan["Actual Rows"] if plan["Node Type"] == "Recursive Union" else 0
    return visited + sum(keys_visited(child) for child in plan.get("Plans", []))


async def test_a_lease_that_reads_every_due_row_visits_no_keys(db: Any) -> None:
    """The loose scan of the keys runs only when rows to park filled the due scan: a lease that
    meets a few new rows behind held keys (as steady traffic brings them) reads no key."""
    await db.execute(HELD_BACKLOG, HELD_KEYS, 5)
    async with db.transaction():
        for n in range(20):
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key=f"k{n}")
    await db.execute("ANALYZE outbox_messages")
    assert await visited_by_a_lease(db) == 0
    # The same lease, its scan full of rows to park, visits the keys (every one, as few as
    # they are here).
    await db.execute(HELD_BACKLOG, HELD_KEYS, 100)
    await db.execute("ANALYZE outbox_messages")
    assert await visited_by_a_lease(db) == HELD_KEYS + 20


async def visited_by_a_lease(db: Any) -> int:
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + lease_statement(100)
    transaction = db.transaction()
    await transaction.start()
    try:
        raw = await db.fetchval(explain, 60.0, True, 1_048_576)
    finally:
        await transaction.rollback()
    return keys_visited((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
