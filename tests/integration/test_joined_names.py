"""Event types and ordering keys written with zero width joiners, from enqueue to the receiver."""

from __future__ import annotations

import json
from typing import Any

import outbox
from tests.conftest import SECRET
from tests.support.outbox_helpers import open_relay, statuses
from tests.support.receiver import Receiver

WOMAN_TECHNOLOGIST = "\U0001f469\u200d\U0001f4bb"  # woman, zero width joiner, laptop
I_WANT = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # Persian, with a zero width non-joiner


async def test_names_with_joiners_are_enqueued_and_delivered_as_written(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    webhooks = {
        WOMAN_TECHNOLOGIST: {"url": receiver.url("/emoji"), "secret": SECRET},
        I_WANT: {"url": receiver.url("/persian")},
    }
    settings = make_settings(webhooks=json.dumps(webhooks))
    async with db.transaction():
        first = await outbox.enqueue(db, WOMAN_TECHNOLOGIST, {"n": 1}, ordering_key=I_WANT)
        second = await outbox.enqueue(db, I_WANT, {"n": 2}, ordering_key=I_WANT)
    async with open_relay(settings) as relay:
        summary = await relay.processor.execute()
    assert (summary.processed, summary.error) == (2, None)
    assert await statuses(db) == {"Processed": 2}
    stored = await db.fetch(
        "SELECT event_type, ordering_key FROM outbox_messages ORDER BY ordering_seq"
    )
    assert [tuple(r) for r in stored] == [(WOMAN_TECHNOLOGIST, I_WANT), (I_WANT, I_WANT)]
    # One key: the second waited for the first, and each went to its event type's endpoint.
    assert [(r.path, r.webhook_id, r.json["type"]) for r in receiver.requests] == [
        ("/emoji", str(first), WOMAN_TECHNOLOGIST),
        ("/persian", str(second), I_WANT),
    ]
    assert "webhook-signature" in receiver.requests[0].headers
