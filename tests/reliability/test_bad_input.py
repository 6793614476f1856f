"""Rows written by hand, outside ``enqueue()``: the relay neither gets stuck on them nor lets them
take its memory. (Bad payloads at enqueue, garbage hints, bad drain parameters and bad settings
are proved in tests/unit and tests/integration; docs/reliability.md lists where.)"""

from __future__ import annotations

from typing import Any

from outbox import store
from outbox.outcomes import MAX_ERROR_CHARS
from tests.support.instrumented_relay import memory_growth_kib
from tests.support.outbox_helpers import open_relay, row, seed
from tests.support.receiver import Receiver
from tests.support.relay_process import relay_env, run_relay

HUGE_BYTES = 20 * 1024 * 1024


async def test_a_processing_row_without_a_lease_is_leased_and_delivered(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # An UPDATE by hand (or a tool) left a row Processing with no lease: no worker holds it.
    message_id = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status) "
        "VALUES (gen_random_uuid(), 'OrderCompleted', '{\"orderId\": 1}', 'Processing') "
        "RETURNING outbox_message_id"
    )
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 1)


async def test_a_lease_expired_by_hand_takes_effect_at_once(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db)
    # A worker leased it for an hour and is stuck; the operator ends its lease by hand, setting
    # only the lease's own deadline (next_attempt_at still shows the hour).
    await store.lease_batch(db, 10, 3600)
    await db.execute(
        "UPDATE outbox_messages SET lease_expires_at = now() WHERE outbox_message_id = $1",
        message_id,
    )
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 2)


async def test_huge_rows_written_by_hand_fail_without_being_loaded_into_the_relay(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    huge = await db.fetch(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "SELECT gen_random_uuid(), 'OrderCompleted', jsonb_build_object('blob', repeat('x', $1)) "
        "FROM generate_series(1, 3) RETURNING outbox_message_id",
        HUGE_BYTES,
    )
    result = await run_relay(
        relay_env(database_url, webhooks), "--", "drain", module="tests.support.instrumented_relay"
    )
    assert result.returncode == 0, result.stderr
    assert result.summary["failed"] == 3
    assert receiver.requests == []
    for record in huge:
        stored = await row(db, record["outbox_message_id"])
        assert stored["status"] == "Failed"
        assert stored["last_error"] == (
            f"payload is {HUGE_BYTES + 12} bytes, above OUTBOX_MAX_PAYLOAD_BYTES=1048576"
        )
        assert len(stored["last_error"]) <= MAX_ERROR_CHARS
    # 60 MB of payloads were leased and none of it crossed into the relay: its memory grew by
    # about 1 MB over the run (a relay that fetches them grows by about 100 MB).
    assert memory_growth_kib(result.stderr) * 1024 < HUGE_BYTES // 2
