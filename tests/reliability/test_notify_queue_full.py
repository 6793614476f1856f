"""A full NOTIFY queue under ``outbox serve`` with ``OUTBOX_WAKEUP=postgres``: a session that
LISTENs and stays idle in a transaction, and large NOTIFYs, fill PostgreSQL's notification queue
until every NOTIFY fails, a producer's wake-up included.

The queue is filled for real, on a private PostgreSQL whose queue is 64 pages (512 KB) instead
of 8 GB (``tests/support/small_notify_queue_pg.py``): the shared test server's would take
minutes to fill and would fail every other test's NOTIFY meanwhile. serve hosts the relay's
functions without their timers: no sweep can deliver what only its polling may.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

import outbox
from outbox.core.settings import Settings
from outbox.relay.wakeups import FALLBACK_POLL_SECONDS
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import open_relay, run_cli
from tests.support.processes import Child
from tests.support.receiver import Receiver
from tests.support.small_notify_queue_pg import SmallNotifyQueueServer, fill, hold_the_queue

KEY = "notify-queue-function-key-012345"
# A wait bounded generously for a busy machine, never timed: serve reads the queue's usage every
# 5 s and polls every 3 s while it is high.
SLACK_SECONDS = 30


@pytest.fixture(scope="module")
def small_queue_server() -> Iterator[SmallNotifyQueueServer]:
    with SmallNotifyQueueServer.running() as server:
        yield server


@pytest.fixture
async def serve_env(
    small_queue_server: SmallNotifyQueueServer,
    receiver: Receiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> dict[str, str]:
    url = await small_queue_server.migrated_database()
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")  # this process's producer, as serve's
    return {
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_WAKEUP": "postgres",
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
        "OUTBOX_FUNCTION_KEY": KEY,
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


@pytest.fixture
async def served(serve_env: dict[str, str]) -> AsyncIterator[tuple[Child, str]]:
    port = free_port()
    app = "tests.support.sweepless_app:app"
    child = await Child.start("outbox", "serve", "--port", str(port), "--app", app, env=serve_env)
    try:
        await child.wait_for_line(r"outbox\.drain trigger=startup")
        yield child, f"http://127.0.0.1:{port}"
    finally:
        await child.kill()


async def enqueue_one(url: str, order: int) -> uuid.UUID:
    """A producer's commit and its wake-up (a NOTIFY that may fail: a warning, never a raise)."""
    conn = await asyncpg.connect(url)
    try:
        async with outbox.transaction(conn) as tx:
            return await tx.enqueue("OrderCompleted", {"orderId": order})
    finally:
        await conn.close()


async def get(url: str, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}{path}", headers={"x-functions-key": KEY}) as response,
    ):
        return response.status, await response.text()


def notify_queue_problems(status: dict[str, object]) -> list[str]:
    problems = status["problems"]
    assert isinstance(problems, list)
    return [p for p in problems if "NOTIFY queue" in p]


@pytest.mark.slow
async def test_a_full_notify_queue_is_reported_and_serve_polls_until_it_is_freed(
    receiver: Receiver,
    serve_env: dict[str, str],
    served: tuple[Child, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    child, url = served
    database = serve_env["OUTBOX_DATABASE_URL"]
    holder = await hold_the_queue(database)
    try:
        assert await fill(database) > 0
        first = await enqueue_one(database, 1)
        # The producer's wake-up failed: a warning in its own log, nothing anywhere else.
        assert "too many notifications in the NOTIFY queue" in caplog.text

        # serve says so (at most once a minute) and polls: the message comes without a wake-up.
        await child.wait_for_line(
            r"wake-ups: PostgreSQL's NOTIFY queue is 100% full", SLACK_SECONDS
        )
        await receiver.wait_for(1, timeout=SLACK_SECONDS)
        assert receiver.requests[0].webhook_id == str(first)
        await child.wait_for_line(r"outbox\.drain trigger=due .*processed=1", SLACK_SECONDS)

        # status says why: the CLI exits 1, the HTTP function answers 503, the gauge reads full.
        cli = await run_cli("status", env=serve_env)
        assert cli.returncode == 1, cli.stdout + cli.stderr
        problems = notify_queue_problems(json.loads(cli.stdout))
        assert len(problems) == 1
        assert "NOTIFY queue is 100% full (threshold 50%)" in problems[0]
        status, body = await get(url, "/api/outbox/status")
        assert status == 503
        assert json.loads(body)["notify_queue_usage"] == 1.0
        assert len(notify_queue_problems(json.loads(body))) == 1
        status, metrics = await get(url, "/metrics")
        assert status == 200
        gauge = re.search(r"^outbox_wakeup_notify_queue_usage\{.*\} (\S+)$", metrics, re.M)
        assert gauge is not None, metrics
        assert float(gauge.group(1)) == 1.0

        await holder.execute("COMMIT")  # it reads what it was sent: the queue empties
    finally:
        await holder.close()
    await child.wait_for_line(
        r"wake-ups: PostgreSQL's NOTIFY queue is back to \d+% full; waiting for wake-ups again",
        SLACK_SECONDS,
    )
    cli = await run_cli("status", env=serve_env)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert notify_queue_problems(json.loads(cli.stdout)) == []
    # Wake-ups again: the next commit's NOTIFY goes through and wakes serve (the first drain on
    # a NOTIFY of this test: none came while the queue was full).
    second = await enqueue_one(database, 2)
    await receiver.wait_for(2, timeout=SLACK_SECONDS)
    assert receiver.requests[1].webhook_id == str(second)
    await child.wait_for_line(r"outbox\.drain trigger=notify ", SLACK_SECONDS)


@pytest.mark.slow
async def test_a_notify_of_the_relays_own_that_fails_makes_it_poll(
    small_queue_server: SmallNotifyQueueServer,
) -> None:
    # Apart from the queue's usage (not read here): PostgreSQL refusing the relay's own NOTIFY
    # (after a requeue, or messages given back) is enough to poll.
    url = await small_queue_server.migrated_database()
    settings = Settings.load(database_url=url, wakeup="postgres")
    holder = await hold_the_queue(url)
    try:
        await fill(url)
        async with open_relay(settings) as relay:
            assert not relay.wakeups.polling(time.monotonic())
            assert await relay.wake_now() is False  # too many notifications: a warning
            assert relay.wakeups.polling(time.monotonic())
            # Each run meanwhile wants the next within a few seconds, not at a wake-up.
            for _ in range(2):
                await relay.drain(trigger="due")
                due_in = relay.wakeups.due_in(time.monotonic())
                assert due_in is not None
                assert due_in <= FALLBACK_POLL_SECONDS
    finally:
        await holder.close()
