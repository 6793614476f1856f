"""Four relay processes drain 10,000 messages at once: each message is delivered exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from tests.support.outbox_helpers import eventually, seed_many, statuses
from tests.support.receiver import Receiver, Reply
from tests.support.relay_process import RelayProcess, relay_env

RELAYS = 4
MESSAGES = 10_000
CONCURRENCY = 16


@pytest.mark.slow
async def test_four_racing_relay_processes_deliver_10000_messages_exactly_once(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    ids = {str(i) for i in await seed_many(db, MESSAGES)}
    # Hold the first requests until every relay has a full set in flight: each process is
    # capped at CONCURRENCY, so this many requests at once proves all of them hold leases together.
    everyone_racing = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=everyone_racing))
    env = relay_env(
        database_url,
        webhooks,
        batch_size=100,
        concurrency=CONCURRENCY,
        lease_seconds=120,  # no lease may expire mid-run, or a duplicate would be legitimate
        http_timeout_seconds=50,
        db_pool_size=3,
    )
    relays = [await RelayProcess(env).start() for _ in range(RELAYS)]
    try:
        await eventually(lambda: receiver.in_flight == RELAYS * CONCURRENCY, timeout=60)
        everyone_racing.set()
        results = await asyncio.gather(*(relay.wait(timeout=150) for relay in relays))
    finally:
        everyone_racing.set()
        for relay in relays:
            if relay.process is not None and relay.process.returncode is None:
                await relay.kill()

    for result in results:
        assert result.returncode == 0, result.stderr[-2000:]
    summaries = [result.summary for result in results]
    assert all(s["processed"] > 0 and s["error"] is None for s in summaries), summaries
    assert sum(s["leased"] for s in summaries) == MESSAGES
    assert sum(s["processed"] for s in summaries) == MESSAGES
    assert sum(s["stale"] + s["unrecorded"] + s["retried"] for s in summaries) == 0
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert set(hits) == ids
    assert set(hits.values()) == {1}
    assert await statuses(db) == {"Processed": MESSAGES}
    assert await db.fetchval("SELECT max(attempt_count) FROM outbox_messages") == 1
