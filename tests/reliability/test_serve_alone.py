"""``outbox serve`` standing alone: retries on its own timer without a queue (or with one that
cannot be reached), wake-ups over PostgreSQL, a database that goes away and comes back, two
replicas on one database, and the endpoints a container host asks.

Every serve here hosts the relay's functions without their timers (``sweepless_app``): no
five-minute sweep can make a delivery these tests wait for, so each one they see was made by what
they test. Waits are bounded generously (``SLACK_SECONDS``), never timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import psycopg
import pytest

import outbox
import outbox.sync
from outbox.azure.host import functions_host
from outbox.core.settings import WAKEUP_CHANNEL
from outbox.hosting.drainer import Drainer, PostgresListener
from tests.conftest import SECRET
from tests.support import pg
from tests.support.azure import connection_string, free_port
from tests.support.azurite import Azurite
from tests.support.outbox_helpers import eventually, run_cli, seed, statuses
from tests.support.processes import Child
from tests.support.receiver import Receiver, Reply
from tests.support.tcp_proxy import TcpProxy

KEY = "serve-alone-function-key-0123456"
# A delivery that only the (absent) sweep could make would never come; a busy machine is slow.
SLACK_SECONDS = 20
Start = Callable[..., Awaitable[tuple[Child, str]]]


@pytest.fixture
def base_env(database_url: str, receiver: Receiver, tmp_path: Path) -> dict[str, str]:
    """serve's settings without any queue."""
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
        "OUTBOX_FUNCTION_KEY": KEY,
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


@pytest.fixture
def pg_env(base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """serve's settings with OUTBOX_WAKEUP=postgres, which this test's producers read too."""
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")
    return {**base_env, "OUTBOX_WAKEUP": "postgres"}


@pytest.fixture
async def start_serve() -> AsyncIterator[Start]:
    children: list[Child] = []

    async def start(env: dict[str, str], *, app: str = "tests.support.sweepless_app:app") -> Any:
        port = free_port()
        child = await Child.start("outbox", "serve", "--port", str(port), "--app", app, env=env)
        children.append(child)
        await child.wait_for_line(r"serving \d+ functions")
        return child, f"http://127.0.0.1:{port}"

    yield start
    for child in children:
        await child.kill()


async def enqueue_one(database_url: str, order: int) -> uuid.UUID:
    conn = await asyncpg.connect(database_url)
    try:
        async with outbox.transaction(conn) as tx:
            return await tx.enqueue("OrderCompleted", {"orderId": order})
    finally:
        await conn.close()


def through(database_url: str, port: int) -> str:
    """``database_url`` by way of a proxy on ``port`` (on 127.0.0.1)."""
    parts = urlsplit(database_url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


def drains(child: Child) -> int:
    return sum(1 for line in child.lines if re.search(r"outbox\.drain trigger=", line))


# --- retries timed in-process, no queue ------------------------------------------------------


@pytest.mark.slow
async def test_without_a_queue_a_retry_comes_when_its_backoff_ends(
    receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    receiver.script("/orders", Reply(503, b"busy"), then=Reply(204))
    # No queue, no sweep: the first attempt is the start-up drain's, the retry the timer's.
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=base_env)
    child, _ = await start_serve(base_env)
    await receiver.wait_for(2, timeout=10 + SLACK_SECONDS)
    assert receiver.requests[1].at - receiver.requests[0].at >= 8.5  # the backoff, not sooner
    assert receiver.requests[0].webhook_id == receiver.requests[1].webhook_id
    await child.wait_for_line(r"outbox\.drain trigger=due .*processed=1")


@pytest.mark.slow
async def test_without_a_queue_a_retry_after_is_honoured(
    receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    receiver.script("/orders", Reply(503, headers={"Retry-After": "3"}), then=Reply(204))
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 2}', env=base_env)
    await start_serve(base_env)
    await receiver.wait_for(2, timeout=3 + SLACK_SECONDS)
    assert receiver.requests[1].at - receiver.requests[0].at >= 2.5


@pytest.mark.slow
async def test_without_a_queue_a_requeue_is_delivered_at_once(
    db: Any, receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    receiver.script("/orders", Reply(410, b"gone"), then=Reply(204))
    _, url = await start_serve(base_env)
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 3}', env=base_env)
    await receiver.wait_for(0, timeout=1)

    async def failed() -> bool:
        # No queue and no sweep: only the HTTP drain delivers the new message.
        async with aiohttp.ClientSession() as http:
            await http.post(f"{url}/api/outbox/drain", headers={"x-functions-key": KEY})
        return await statuses(db) == {"Failed": 1}

    await eventually(failed, timeout=SLACK_SECONDS)
    async with aiohttp.ClientSession() as http:
        requeue = f"{url}/api/outbox/requeue"
        body = {"all_failed": True}
        async with http.post(requeue, json=body, headers={"x-functions-key": KEY}) as r:
            assert (r.status, (await r.json())["requeued"]) == (200, 1)
    await receiver.wait_for(2, timeout=SLACK_SECONDS)

    async def processed() -> bool:
        return await statuses(db) == {"Processed": 1}

    await eventually(processed, timeout=SLACK_SECONDS)


async def post(url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        headers = {"x-functions-key": KEY}
        async with http.post(f"{url}/api/outbox/{path}", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            answer: dict[str, Any] = await r.json()
            return answer


@pytest.mark.slow
async def test_without_a_queue_a_resume_is_delivered_at_once(
    db: Any, receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    _, url = await start_serve(base_env)
    await post(url, "pause", {"event_type": "OrderCompleted"})
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 5}', env=base_env)
    drained = await post(url, "drain")  # no queue, no sweep: the drain meets the pause
    assert drained["processed"] == 0
    assert receiver.requests == []
    # Paused: it waits (looked at again in five minutes), no attempt spent.
    assert await db.fetchval("SELECT attempt_count FROM outbox_messages") == 0
    resumed = await post(url, "resume", {"event_type": "OrderCompleted"})
    assert resumed["due"] == 1
    # Only serve's own timer, armed by the resume, can deliver it now.
    await receiver.wait_for(1, timeout=SLACK_SECONDS)

    async def processed() -> bool:
        return await statuses(db) == {"Processed": 1}

    await eventually(processed, timeout=SLACK_SECONDS)


@pytest.mark.slow
async def test_without_a_queue_an_open_breaker_is_probed_when_its_cool_down_ends(
    db: Any, receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    # Ten failures in a row open the breaker (10 s); the messages wait for its reopen.
    receiver.script("/orders", *[Reply(503, b"busy")] * 10, then=Reply(204))
    for order in range(12):
        await run_cli("enqueue", "OrderCompleted", json.dumps({"orderId": order}), env=base_env)
    # One request at a time: exactly the ten failures before the breaker opens.
    await start_serve({**base_env, "OUTBOX_CONCURRENCY": "1"})

    async def opened() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM outbox_endpoints WHERE opens > 0"))

    await eventually(opened, timeout=SLACK_SECONDS)
    await receiver.wait_for(10, timeout=SLACK_SECONDS)
    failures = 10
    # The probe and the rest come from serve's timer at the reopen: no queue, no sweep.
    await receiver.wait_for(failures + 12, timeout=10 + 2 * SLACK_SECONDS)

    async def processed() -> bool:
        return await statuses(db) == {"Processed": 12}

    await eventually(processed, timeout=SLACK_SECONDS)
    probe = receiver.requests[failures]
    assert probe.at - receiver.requests[failures - 1].at >= 8.5  # after the cool-down


@pytest.mark.slow
async def test_with_the_queue_unreachable_a_retry_stays_on_time(
    receiver: Receiver, base_env: dict[str, str], start_serve: Start, azurite: Azurite
) -> None:
    queue = await TcpProxy("127.0.0.1", azurite.queue_port).start()
    try:
        env = {
            **base_env,
            "AzureWebJobsStorage": connection_string(queue.port),
            "OUTBOX_QUEUE_NAME": f"wakeup-{uuid.uuid4().hex[:16]}",
        }
        receiver.script("/orders", Reply(503, headers={"Retry-After": "3"}), then=Reply(204))
        child, url = await start_serve(env)
        queue.down()  # from here on no hint is sent or received
        async with aiohttp.ClientSession() as http:
            await run_cli("enqueue", "OrderCompleted", '{"orderId": 4}', env=base_env)
            drain = f"{url}/api/outbox/drain"
            async with http.post(drain, headers={"x-functions-key": KEY}) as r:
                assert r.status == 200
        await receiver.wait_for(2, timeout=3 + SLACK_SECONDS)
        assert queue.refused > 0  # serve did try the queue, in vain
        await child.wait_for_line(r"outbox\.drain trigger=due .*processed=1")
    finally:
        await queue.stop()


# --- wake-ups over PostgreSQL -----------------------------------------------------------------


@pytest.mark.slow
async def test_over_postgres_an_enqueue_is_delivered_without_any_queue(
    database_url: str, receiver: Receiver, pg_env: dict[str, str], start_serve: Start
) -> None:
    child, _ = await start_serve(pg_env)
    await child.wait_for_line(r"outbox\.drain trigger=startup")
    message_id = await enqueue_one(database_url, 5)
    await receiver.wait_for(1, timeout=SLACK_SECONDS)
    assert receiver.requests[0].webhook_id == str(message_id)
    await child.wait_for_line(r"outbox\.drain trigger=notify .*processed=1")
    assert await child.stop() == 0  # SIGTERM: the listener and the timer stop with it
    assert child.lines[-1].endswith("stopped")


async def test_a_rolled_back_enqueue_sends_no_wake_up_and_a_committed_one_sends_one(
    db: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    await listener.add_listener(WAKEUP_CHANNEL, lambda *args: heard.put_nowait(args[2]))
    try:
        with pytest.raises(RuntimeError):
            async with outbox.transaction(db) as tx:
                await tx.enqueue("OrderCompleted", {"orderId": 6})
                raise RuntimeError("the business transaction fails")
        async with outbox.transaction(db) as tx:
            for order in (7, 8):  # one wake-up per transaction, however many rows
                await tx.enqueue("OrderCompleted", {"orderId": order})
        assert await asyncio.wait_for(heard.get(), SLACK_SECONDS) == WAKEUP_CHANNEL
        # Whatever the rolled-back one sent would have come before the committed one's.
        await listener.execute("SELECT 1")
        assert heard.empty()
        assert await db.fetchval("SELECT count(*) FROM outbox_messages") == 2
        # enqueue by hand, then notify on the connection that committed
        async with db.transaction():
            await outbox.enqueue(db, "OrderCompleted", {"orderId": 9})
        assert await outbox.notify(conn=db) is True
        assert await asyncio.wait_for(heard.get(), SLACK_SECONDS) == WAKEUP_CHANNEL
        assert await outbox.notify() is False  # without the connection: a warning, no raise
    finally:
        await listener.close()


def test_the_sync_producer_sends_the_wake_up_with_its_commit(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        with psycopg.connect(database_url) as conn:
            with outbox.sync.transaction(conn) as tx:
                tx.enqueue("OrderCompleted", {"orderId": 9})
        heard = list(listener.notifies(timeout=SLACK_SECONDS, stop_after=1))
    assert [n.channel for n in heard] == [WAKEUP_CHANNEL]


@pytest.mark.slow
async def test_over_postgres_serve_survives_a_database_restart_and_drains_what_came_meanwhile(
    database_url: str, receiver: Receiver, pg_env: dict[str, str], start_serve: Start
) -> None:
    proxy = await TcpProxy("127.0.0.1", urlsplit(database_url).port or 5432).start()
    try:
        env = {**pg_env, "OUTBOX_DATABASE_URL": through(database_url, proxy.port)}
        child, _ = await start_serve(env)
        await child.wait_for_line(r"outbox\.drain trigger=startup")
        proxy.down()  # as a restart looks from serve: every connection reset, none taken
        await child.wait_for_line(r"wake-ups: (the LISTENing connection is lost|cannot LISTEN)")
        ids = [await enqueue_one(database_url, order) for order in range(3)]  # NOTIFYs lost
        proxy.up()
        await child.wait_for_line(r"wake-ups: listening again", timeout=SLACK_SECONDS)
        await receiver.wait_for(3, timeout=SLACK_SECONDS)
        assert {r.webhook_id for r in receiver.requests} == {str(i) for i in ids}
    finally:
        await proxy.stop()


async def test_over_postgres_serve_polls_while_its_listen_cannot_connect(
    db: Any, app_env: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pool answers, a new LISTEN does not (here: it is sent where nothing listens), so no
    # NOTIFY is heard: without polling, a commit would wait for the timer's next look (a minute).
    monkeypatch.setenv("OUTBOX_WAKEUP", "postgres")
    drainer = Drainer()
    stopping = asyncio.Event()
    deaf = PostgresListener(f"postgresql://postgres@127.0.0.1:{free_port()}/none", drainer)
    tasks = [asyncio.create_task(drainer.run(stopping)), asyncio.create_task(deaf.run(stopping))]
    try:
        relay = await functions_host.relay()
        await eventually(lambda: relay.wakeups.polling(time.monotonic()))
        [message_id] = await seed(db)
        await receiver.wait_for(1, timeout=SLACK_SECONDS)
        assert receiver.requests[0].webhook_id == str(message_id)
        stopping.set()
        await asyncio.gather(*tasks)
        # A listener that connects ends the polling.
        stopping = asyncio.Event()
        heard = PostgresListener(os.environ["OUTBOX_DATABASE_URL"], drainer)
        tasks = [asyncio.create_task(heard.run(stopping))]
        await eventually(lambda: not relay.wakeups.polling(time.monotonic()))
    finally:
        stopping.set()
        await asyncio.gather(*tasks)


@pytest.mark.slow
async def test_two_replicas_over_postgres_deliver_each_message_once_without_a_drain_storm(
    database_url: str, receiver: Receiver, pg_env: dict[str, str], start_serve: Start
) -> None:
    messages = 60
    replicas = [(await start_serve(pg_env))[0] for _ in range(2)]
    for child in replicas:
        await child.wait_for_line(r"outbox\.drain trigger=startup")
    before = sum(drains(child) for child in replicas)
    for order in range(messages):
        await enqueue_one(database_url, order)
    await receiver.wait_for(messages, timeout=SLACK_SECONDS * 3)
    await asyncio.sleep(1)  # a duplicate, were there one, would come now
    ids = [r.webhook_id for r in receiver.requests]
    assert len(ids) == len(set(ids)) == messages
    made = sum(drains(child) for child in replicas) - before
    print(f"two replicas: {made} drains for {messages} messages")
    # At most one per wake-up and replica (one commit at a time here: the worst case), never more.
    assert made <= 2 * messages


# --- for container hosts ----------------------------------------------------------------------


@pytest.mark.slow
async def test_health_readiness_and_metrics_answer_as_documented(
    receiver: Receiver, base_env: dict[str, str], start_serve: Start
) -> None:
    _, url = await start_serve(base_env)
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 10}', env=base_env)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/outbox/drain", headers={"x-functions-key": KEY}):
            pass
        async with http.get(f"{url}/healthz") as r:
            assert (r.status, await r.json()) == (200, {"status": "ok"})
        async with http.get(f"{url}/readyz") as r:
            assert (r.status, await r.json()) == (200, {"status": "ready"})
        async with http.get(f"{url}/metrics") as r:
            assert r.status == 401
        async with http.get(f"{url}/metrics", headers={"x-functions-key": KEY}) as r:
            text = await r.text()
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
        assert re.search(r"^outbox_deliveries_total\{.*\} 1\.0$", text, re.MULTILINE), text
        assert SECRET not in text
        assert receiver.url("/orders") not in text


@pytest.mark.slow
async def test_readyz_is_a_bare_503_while_migrations_are_missing(
    admin_dsn: str, base_env: dict[str, str], start_serve: Start
) -> None:
    name = pg.unique_name("unmigrated")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        env = {**base_env, "OUTBOX_DATABASE_URL": pg.with_database(admin_dsn, name)}
        child, url = await start_serve(env)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/readyz") as r:
                assert (r.status, await r.json()) == (503, {"status": "not ready"})
            async with http.get(f"{url}/healthz") as r:
                assert r.status == 200
        await child.wait_for_line(r"/readyz: not ready: .*\(run python -m outbox migrate\)")
        await child.kill()
    finally:
        await pg.drop(admin_dsn, name)
