"""Rows written by hand, outside ``enqueue()``: the relay neither gets stuck on them nor lets them
take its memory. (Bad payloads at enqueue, garbage hints, bad drain parameters and bad settings
are proved in tests/unit and tests/integration; docs/reliability.md lists where.)"""

from __future__ import annotations

from typing import Any

from tests.support.outbox_helpers import open_relay, row
from tests.support.receiver import Receiver


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
