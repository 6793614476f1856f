"""Lease edge cases with real processes: a worker frozen past its lease, and workers whose wall
clocks are wrong. Every lease time comes from the database's ``now()``."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from email.utils import formatdate
from typing import Any

import pytest

from outbox.store import QUERIES
from tests.conftest import SECRET
from tests.support.outbox_helpers import (
    open_relay,
    row,
    seed,
    seed_many,
    statuses,
    wait_for_leases_to_expire,
)
from tests.support.receiver import Receiver, Reply
from tests.support.relay_process import RelayProcess, relay_env, run_relay

HOUR = 3600


async def test_a_worker_frozen_past_its_lease_cannot_overwrite_the_newer_outcome(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    [message_id] = await seed(db)
    answer_late = asyncio.Event()
    # The first worker's request is answered with a failure, but only once it is frozen.
    receiver.script("/orders", Reply(500, b"late failure", hold=answer_late), then=Reply(200))
    env = relay_env(database_url, webhooks, lease_seconds=4, http_timeout_seconds=1.5)
    frozen = await RelayProcess(env).start()
    try:
        await receiver.wait_for(1, timeout=30)
        frozen.send(signal.SIGSTOP)  # a stalled VM, a stop-the-world pause: the lease runs out
        answer_late.set()
        await wait_for_leases_to_expire(db)
        fresh = await run_relay(env)
    finally:
        frozen.send(signal.SIGCONT)
    late = await frozen.wait()

    assert fresh.returncode == 0, fresh.stderr
    assert fresh.summary["processed"] == 1
    assert late.returncode == 0, late.stderr
    assert (late.summary["stale"], late.summary["retried"], late.summary["processed"]) == (1, 0, 0)
    assert "outcome=Stale" in late.stderr  # the dropped outcome is logged
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"], stored["last_error"]) == (
        "Processed",
        2,
        None,
    )


def test_lease_and_outcome_statements_take_durations_never_timestamps() -> None:
    for name in ("lease_batch", "record_outcomes", "record_delivered"):
        # The one timestamp an outcome write takes is the database's own: the leased rows'
        # created_at, read back to find their partitions (docs/partitioning.md).
        statement = re.sub(
            r"m\.created_at BETWEEN \$\d+::timestamptz AND \$\d+::timestamptz", "", QUERIES[name]
        )
        assert "now()" in statement
        assert not re.search(r"\$\d+::(timestamp|timestamptz|date)", statement)
    # The lease length and retry delays are bound as seconds and added to now() in the database.
    assert "now() + make_interval(secs => $1)" in QUERIES["lease_batch"]
    assert "now() + make_interval(secs => o.delay_seconds)" in QUERIES["record_outcomes"]


@pytest.mark.parametrize(
    "skew", [HOUR, -HOUR], ids=["worker-clock-1h-ahead", "worker-clock-1h-behind"]
)
async def test_leases_follow_the_database_clock_whatever_the_worker_clock_says(
    db: Any, database_url: str, receiver: Receiver, skew: int
) -> None:
    [due, expired, held, failing, dated] = await seed(db, 5)
    await db.execute(
        "UPDATE outbox_messages SET event_type = 'Flaky' WHERE outbox_message_id = $1", failing
    )
    await db.execute(
        "UPDATE outbox_messages SET event_type = 'Dated' WHERE outbox_message_id = $1", dated
    )
    # A dead worker's lease that ran out a second ago, and a live worker's lease for a minute.
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processing', lease_token = gen_random_uuid(), "
        "attempt_count = 1, lease_expires_at = now() - interval '1 second', "
        "next_attempt_at = now() - interval '1 second' WHERE outbox_message_id = $1",
        expired,
    )
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processing', lease_token = gen_random_uuid(), "
        "attempt_count = 1, lease_expires_at = now() + interval '1 minute', "
        "next_attempt_at = now() + interval '1 minute' WHERE outbox_message_id = $1",
        held,
    )
    held_before = await _lease(db, held)
    receiver.script("/flaky", then=Reply(503))
    # A Retry-After date two minutes ahead by the receiver's (and the database's) clock.
    in_two_minutes = formatdate(time.time() + 120, usegmt=True)
    receiver.script("/dated", then=Reply(503, headers={"Retry-After": in_two_minutes}))
    webhooks = {
        "OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET},
        "Flaky": {"url": receiver.url("/flaky")},
        "Dated": {"url": receiver.url("/dated")},
    }
    result = await run_relay(
        relay_env(database_url, webhooks, lease_seconds=30, http_timeout_seconds=5),
        "--clock-skew",
        str(skew),
        "--",
        "drain",
        module="tests.support.instrumented_relay",
    )

    assert result.returncode == 0, result.stderr
    # The worker's clock really was off: the attempt history, which is for reading, shows it.
    started = await db.fetch("SELECT started_at FROM outbox_attempts")
    assert all(abs(r["started_at"].timestamp() - (time.time() + skew)) < 60 for r in started)
    # The signatures carry the database's time, or every receiver would reject them.
    stamps = [int(r.headers["webhook-timestamp"]) for r in receiver.requests]
    assert all(abs(stamp - time.time()) < 60 for stamp in stamps)
    # Whatever that clock said, the database decided what was due and what was still leased.
    assert sorted(r.webhook_id for r in receiver.to("/orders")) == sorted(map(str, [due, expired]))
    assert await _lease(db, held) == held_before  # untouched
    for message_id in (due, expired):
        stored = await row(db, message_id)
        assert stored["status"] == "Processed"
        assert await _seconds_from_database_now(db, stored["processing_started_at"]) < 60
        assert await _seconds_from_database_now(db, stored["processed_at"]) < 60
    retried = await row(db, failing)
    assert retried["status"] == "Pending"
    assert 0 < retried["due_in"] <= 10.0  # the first backoff step, from the database's now()
    # The date is read against the database's clock too: two minutes, not 0 s or 62 minutes.
    assert 110 <= (await row(db, dated))["due_in"] <= 121


async def _lease(db: Any, message_id: Any) -> tuple[Any, ...]:
    stored = await row(db, message_id)
    return tuple(
        stored[c]
        for c in ("status", "attempt_count", "lease_token", "lease_expires_at", "last_error")
    )


async def _seconds_from_database_now(db: Any, moment: Any) -> float:
    seconds: float = await db.fetchval("SELECT abs(extract(epoch FROM now() - $1))::float8", moment)
    return seconds


@pytest.mark.slow
async def test_many_runs_at_once_in_one_process_do_not_lease_and_give_back_in_circles(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Twenty drains at once in one process (HTTP drains, a hint, the timer) share its four
    # delivery slots; each run's budget ends while others' requests hold the slots.
    messages = 600
    await seed_many(db, messages)
    receiver.script("/orders", then=Reply(200, delay=0.02))
    settings = make_settings(concurrency=4, batch_size=50)
    summaries: list[Any] = []
    async with open_relay(settings) as relay:

        async def drain_until_done() -> None:
            while (await statuses(relay.pool)).get("Processed", 0) < messages:
                summaries.append(await relay.processor.execute(budget_seconds=0.5))

        await asyncio.wait_for(asyncio.gather(*(drain_until_done() for _ in range(20))), 120)
    assert await statuses(db) == {"Processed": messages}
    released = sum(s.released for s in summaries)
    leased = sum(s.leased for s in summaries)
    # Given back only what a run's budget caught waiting, not its whole lease over and over
    # (before runs leased only what the slots could start in time: about three per delivery).
    assert released <= messages, (released, leased)
    assert leased == messages + released


async def test_status_reports_a_host_clock_far_off_the_database_s(
    database_url: str, webhooks: dict[str, Any]
) -> None:
    result = await run_relay(
        relay_env(database_url, webhooks),
        "--clock-skew",
        "-300",
        "--",
        "status",
        module="tests.support.instrumented_relay",
    )
    assert result.returncode == 1  # unhealthy
    status = json.loads(result.stdout.strip().splitlines()[-1])
    assert -310 < status["clock_offset_seconds"] < -290
    assert status["problems"] == [
        "this host's clock is 300s behind the database's: signatures carry the database's time, "
        "but check the host's time synchronisation (NTP)"
    ]
