"""A relay process killed with SIGKILL mid-batch: after its lease, another relay delivers the rest.

The relays are real ``python -m outbox drain`` processes; the receiver runs in the test's event
loop and holds requests open, so the kill lands while deliveries are in flight.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from tests.conftest import SECRET
from tests.support.outbox_helpers import eventually, seed, statuses, wait_for_leases_to_expire
from tests.support.receiver import Receiver, Reply
from tests.support.relay_process import RelayProcess, relay_env, run_relay

MESSAGES = 30
BATCH = 5
CONCURRENCY = 5
# Short enough to wait out, long enough that no held request times out before the kill.
LEASE_SECONDS = 9
HTTP_TIMEOUT_SECONDS = 4


@pytest.mark.slow
async def test_sigkill_mid_batch_loses_nothing_and_duplicates_only_in_flight_rows(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    ids = {str(i) for i in await seed(db, MESSAGES)}
    release = asyncio.Event()
    # The first two batches are answered at once; every later request hangs until released.
    receiver.script("/orders", *[Reply(200)] * (2 * BATCH), then=Reply(200, hold=release))
    env = relay_env(
        database_url,
        webhooks,
        batch_size=BATCH,
        concurrency=CONCURRENCY,
        lease_seconds=LEASE_SECONDS,
        http_timeout_seconds=HTTP_TIMEOUT_SECONDS,
    )

    async def mid_batch() -> bool:
        # Two batches recorded, the next one's requests all hanging at the receiver.
        return receiver.in_flight == CONCURRENCY and await db.fetchval(
            "SELECT count(*) = $1 FROM outbox_messages WHERE status = 'Processed'", 2 * BATCH
        )

    doomed = await RelayProcess(env).start()
    try:
        await eventually(mid_batch, timeout=60)
    except AssertionError:
        await doomed.kill()
        raise
    killed = await doomed.kill()
    assert killed.returncode == -9
    # A statement the relay had sent (a lease, say) runs on in its server backend and commits
    # after the kill: the snapshot waits until that backend has noticed and gone.
    await eventually(lambda: _other_backends_gone(db), timeout=30)
    at_kill = await _snapshot(db)
    delivered_before_kill = {r.webhook_id for r in receiver.requests}
    release.set()  # the receiver answers the dead relay's requests: nobody records them

    # While the dead relay's leases hold, its rows stay put.
    assert at_kill["Processing"], "the kill must land while rows are leased"
    await wait_for_leases_to_expire(db, timeout=LEASE_SECONDS + 30)
    survivor = await run_relay(env)

    assert survivor.returncode == 0, survivor.stderr
    assert survivor.summary["processed"] == MESSAGES - len(at_kill["Processed"])
    assert await statuses(db) == {"Processed": MESSAGES}
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert set(hits) == ids  # every message delivered at least once
    in_flight_at_kill = delivered_before_kill - at_kill["Processed"]
    assert in_flight_at_kill, "the kill must land while requests are in flight"
    duplicated = {message_id for message_id, n in hits.items() if n > 1}
    assert duplicated <= in_flight_at_kill
    assert all(n <= 2 for n in hits.values())
    attempts = await _attempts(db)
    for message_id in ids:
        leased_twice = message_id in at_kill["Processing"]
        assert attempts[message_id] == (2 if leased_twice else 1), message_id
        assert hits[message_id] <= attempts[message_id]
    for request in receiver.requests:
        Webhook(SECRET).verify(request.body, request.headers)


async def _other_backends_gone(db: Any) -> bool:
    # This database is the test's own: besides this connection, only the relay's were in it.
    others = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    return bool(others == 0)


async def _snapshot(db: Any) -> dict[str, set[str]]:
    rows = await db.fetch("SELECT outbox_message_id, status FROM outbox_messages")
    by_status: dict[str, set[str]] = {"Pending": set(), "Processing": set(), "Processed": set()}
    for row in rows:
        by_status.setdefault(row["status"], set()).add(str(row["outbox_message_id"]))
    return by_status


async def _attempts(db: Any) -> dict[str, int]:
    rows = await db.fetch("SELECT outbox_message_id, attempt_count FROM outbox_messages")
    return {str(r["outbox_message_id"]): r["attempt_count"] for r in rows}
