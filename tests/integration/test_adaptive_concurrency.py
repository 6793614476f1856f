"""Latency-bound delivery: many requests in flight, each endpoint within what it sustains.

Real receivers on 127.0.0.1 that take their time or push back; the counts are the receiver's
(requests in flight as each one arrived) and the database's, never timings.
"""

from __future__ import annotations

import asyncio
from typing import Any

from outbox.relay.lease import max_waiting
from outbox.relay.limits import INITIAL_LIMIT
from tests.conftest import SECRET
from tests.support.outbox_helpers import open_relay, seed_many, statuses
from tests.support.receiver import Received, Receiver, Reply

SLOW = Reply(200, delay=0.3)


async def test_a_slow_receiver_gets_many_more_requests_at_once_than_the_initial_limit(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", then=SLOW)
    await seed_many(db, 600)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 600
    # It doubles while the receiver answers at the same pace: 16, 32, 64, ...
    assert receiver.max_in_flight >= 3 * INITIAL_LIMIT


async def test_max_concurrency_still_bounds_an_endpoint_that_answers_slowly(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", then=SLOW)
    await seed_many(db, 300)
    webhooks = {
        "OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET, "max_concurrency": 20}
    }
    async with open_relay(make_settings(webhooks=webhooks)) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 300
    assert receiver.max_in_flight == 20  # grown past the initial 16, up to its cap


async def test_an_endpoint_that_pushes_back_gets_fewer_requests_while_another_keeps_its_pace(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # /busy takes 8 requests at once and answers 503 to any more; /fine takes them all.
    def answer(request: Received) -> Reply:
        if request.path == "/busy" and receiver.in_flight_to["/busy"] > 8:
            return Reply(503)
        return Reply(200, delay=0.1)

    receiver.responder = answer
    await seed_many(db, 300, "OrderCompleted")
    await seed_many(db, 300, "Unsigned")
    webhooks = {
        "OrderCompleted": {"url": receiver.url("/busy"), "secret": SECRET},
        "Unsigned": {"url": receiver.url("/fine")},
    }
    async with open_relay(make_settings(webhooks=webhooks)) as relay:
        await relay.processor.execute()
    busy = [r for r in receiver.requests if r.path == "/busy"]
    accepted = sum(1 for n in receiver.in_flight_at_arrival["/busy"] if n < 8)
    refused = len(busy) - accepted
    # Sent as many at once as before it adapted (16), /busy would refuse about one in two.
    assert refused <= accepted / 4
    assert max(receiver.in_flight_at_arrival["/busy"][2 * INITIAL_LIMIT :]) <= 12
    # The other endpoint got all its messages, with more requests at once than /busy's cap.
    assert len({r.webhook_id for r in receiver.to("/fine")}) == 300
    assert max(receiver.in_flight_at_arrival["/fine"]) >= INITIAL_LIMIT


async def test_leased_messages_not_yet_sent_stay_bounded_behind_a_slow_receiver(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", then=SLOW)
    await seed_many(db, 3000)
    settings = make_settings()
    leased: list[int] = []
    async with open_relay(settings) as relay:
        drain = asyncio.create_task(relay.processor.execute())
        while not drain.done():
            leased.append(
                await db.fetchval(
                    "SELECT count(*) FROM outbox_messages WHERE status = 'Processing'"
                )
            )
            await asyncio.sleep(0.05)
        summary = await drain
    assert summary.processed == 3000
    assert await statuses(db) == {"Processed": 3000}
    # In flight, waiting for a slot (at most ``max_waiting``), and one lease's worth besides:
    # not the 22 batches of 100 the lease loop alone would allow.
    assert max(leased) >= settings.batch_size  # sampled while there was work
    assert max(leased) <= settings.concurrency + max_waiting(settings) + settings.batch_size
