"""A dead or failing endpoint: its circuit breaker opens for every relay, its messages wait
without spending attempts, and it never holds up a healthy endpoint."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from outbox.breakers import THRESHOLD
from tests.support.outbox_helpers import open_relay, seed_many, statuses
from tests.support.raw_server import RawServer
from tests.support.receiver import Received, Receiver, Reply
from tests.support.relay_process import relay_env, run_relay


async def breaker(db: Any) -> Any:
    return await db.fetchrow(
        "SELECT consecutive_failures, opens, extract(epoch FROM reopen_at - now()) AS reopen_in "
        "FROM outbox_endpoints WHERE event_type = 'Flaky' AND endpoint = 'Flaky'"
    )


async def cool_down_over(db: Any) -> None:
    """As if the cool-down had passed, and the messages it held were due again."""
    await db.execute("UPDATE outbox_endpoints SET reopen_at = now()")
    await db.execute("UPDATE outbox_messages SET next_attempt_at = now() WHERE status = 'Pending'")


@pytest.mark.slow
async def test_a_breaker_opens_for_every_relay_process_is_probed_once_and_closes(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    healthy = False
    receiver.responder = lambda _: Reply(200 if healthy else 503, b"down")
    await seed_many(db, 30, event_type="Flaky")
    env = relay_env(
        database_url, {"Flaky": {"url": receiver.url("/flaky")}}, concurrency=4, batch_size=30
    )

    first = await run_relay(env)  # relay A
    assert first.returncode == 0, first.stderr
    sent = len(receiver.requests)
    assert 10 <= sent <= 14  # ten failures in a row open it (and what was already in flight)
    state = await breaker(db)
    assert (state["opens"], state["consecutive_failures"] >= 10) == (1, True)
    assert 5 < state["reopen_in"] <= 10
    counts = await statuses(db)
    assert counts == {"Pending": 30}  # none failed by the breaker
    unspent = await db.fetchval("SELECT count(*) FROM outbox_messages WHERE attempt_count = 0")
    assert unspent == 30 - sent  # held ones spent no attempt

    # Relay B, another process, learns it from the database: a new message waits too.
    await seed_many(db, 1, event_type="Flaky")
    second = await run_relay(env)
    assert second.returncode == 0, second.stderr
    assert len(receiver.requests) == sent
    held = await db.fetchrow(
        "SELECT attempt_count, extract(epoch FROM next_attempt_at - now()) AS due_in "
        "FROM outbox_messages ORDER BY created_at DESC LIMIT 1"
    )
    assert held["attempt_count"] == 0
    assert 0 < held["due_in"] <= 10

    # Cool-down over: one probe; it fails, and the breaker opens again, for twice as long.
    await cool_down_over(db)
    probed = await run_relay(env)
    assert probed.returncode == 0, probed.stderr
    assert len(receiver.requests) == sent + 1
    state = await breaker(db)
    assert state["opens"] == 2
    assert 15 < state["reopen_in"] <= 20

    # The endpoint is back: the next probe succeeds, the breaker closes, everything is sent.
    healthy = True
    await cool_down_over(db)
    recovered = await run_relay(env)
    assert recovered.returncode == 0, recovered.stderr
    assert await statuses(db) == {"Processed": 31}
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints") == 0


async def never_answer(writer: asyncio.StreamWriter, server: RawServer) -> None:
    await asyncio.Event().wait()  # accepts the connection, reads the request, says nothing


@pytest.mark.slow
async def test_a_dead_endpoint_never_holds_up_a_healthy_one(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    dead = await RawServer(never_answer).start()
    try:
        await seed_many(db, 1000, event_type="Dead")  # before the healthy ones: leased first
        await seed_many(db, 200, event_type="OrderCompleted")
        webhooks = {
            "Dead": {"url": dead.url("/never")},
            "OrderCompleted": {"url": receiver.url("/orders")},
        }
        settings = make_settings(webhooks=webhooks, http_timeout_seconds=3)
        delivered_at: list[float] = []
        receiver.responder = lambda request: _noting(delivered_at, request)
        async with open_relay(settings) as relay:
            started = time.monotonic()
            summary = await relay.processor.execute(budget_seconds=20)
    finally:
        await dead.stop()
    assert len(delivered_at) == 200
    assert max(delivered_at) - started <= 12  # alone they take under a second
    # The dead endpoint got what was in flight, what replaced the failures before the tenth
    # (the breaker is closed until then), and one probe after the cool-down; no more.
    assert settings.concurrency <= dead.requests <= settings.concurrency + THRESHOLD
    assert summary.failed == 0
    counts = await statuses(db)
    assert counts == {"Processed": 200, "Pending": 1000}


def _noting(times: list[float], request: Received) -> Reply:
    times.append(time.monotonic())
    return Reply(200)
