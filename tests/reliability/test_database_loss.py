"""The database goes away mid-drain: backends terminated, or the server unreachable for a while.

The relay runs in the test's process with its real pool, so "the next run" is the same process
reusing the same pool, as a Functions worker would.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import azure.functions as func
import pytest

from outbox.azure import functions as relay_functions
from outbox.core.models import DrainSummary
from outbox.core.settings import QueueSettings
from outbox.relay.processor import OutboxProcessor
from outbox.store.postgres import PostgresStore
from outbox.transport.publisher import Publisher
from tests.support.azure import free_port
from tests.support.outbox_helpers import (
    eventually,
    open_relay,
    run_cli,
    seed,
    statuses,
    wait_for_leases_to_expire,
)
from tests.support.processes import Child
from tests.support.receiver import Receiver, Reply
from tests.support.relay_process import relay_env
from tests.support.tcp_proxy import TcpProxy

MESSAGES = 10
# Larger than MESSAGES: the one batch comes back short, so the relay waits for it instead of
# leasing ahead, and the only statement caught by the fault is the outcome write.
BATCH = 2 * MESSAGES
DB_PASSWORD = "db-pw-must-never-leak"  # the test server ignores it (trust auth)


@pytest.fixture
async def observer(database_url: str) -> AsyncIterator[Any]:
    """A second connection to watch and terminate backends while ``db`` holds row locks (inside a
    transaction, pg_stat_activity would show ``db`` the same snapshot over and over)."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


def through(proxy: TcpProxy, database_url: str) -> str:
    """``database_url`` routed through ``proxy``, with a password that must never be shown."""
    parts = urlsplit(database_url)
    user = parts.username or "postgres"
    return urlunsplit(parts._replace(netloc=f"{user}:{DB_PASSWORD}@127.0.0.1:{proxy.port}"))


async def relay_backends(db: Any, *test_connections: Any) -> list[int]:
    """Server processes of this test's database, other than the test's own connections."""
    rows = await db.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND pid <> ALL($1::int[])",
        [conn.get_server_pid() for conn in test_connections],
    )
    return [r["pid"] for r in rows]


async def terminate(db: Any, pids: list[int]) -> None:
    for pid in pids:
        await db.execute("SELECT pg_terminate_backend($1)", pid)


async def write_waiting_on_lock(observer: Any) -> int | None:
    """The relay backend whose outcome write waits for the test's row locks, if any."""
    pid: int | None = await observer.fetchval(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' LIMIT 1"
    )
    return pid


async def deliveries_in_flight(receiver: Receiver, count: int) -> None:
    await eventually(lambda: receiver.in_flight == count, timeout=30)


async def test_terminated_backends_are_replaced_and_every_outcome_is_recorded_once(
    db: Any, observer: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, MESSAGES)
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    settings = make_settings(batch_size=BATCH, concurrency=MESSAGES)
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await deliveries_in_flight(receiver, MESSAGES)
        # 1. Every connection the relay holds (idle in its pool) is terminated.
        pooled = await relay_backends(db, observer)
        assert pooled, "the relay should hold a pooled connection"
        await terminate(db, pooled)
        # 2. The outcome write is terminated in the middle of its statement: the test holds the
        #    rows' locks so the write waits, kills the backend running it, and lets the retry in.
        locks = db.transaction()
        await locks.start()
        await db.execute("SELECT 1 FROM outbox_messages FOR UPDATE")
        release.set()
        first = await _eventually_value(lambda: write_waiting_on_lock(observer))
        await terminate(observer, [first])
        await eventually(lambda: _differs(write_waiting_on_lock(observer), first))
        await locks.rollback()
        summary = await run
    assert (summary.processed, summary.unrecorded, summary.error) == (MESSAGES, 0, None)
    assert await statuses(db) == {"Processed": MESSAGES}
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert hits == Counter({str(i): 1 for i in ids})


@pytest.mark.slow
async def test_backends_terminated_until_the_run_gives_up_report_a_clean_error_then_recover(
    db: Any,
    observer: Any,
    receiver: Receiver,
    make_settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = await seed(db, MESSAGES)
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    settings = make_settings(
        batch_size=BATCH, concurrency=MESSAGES, lease_seconds=4, http_timeout_seconds=1.5
    )
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await deliveries_in_flight(receiver, MESSAGES)
        locks = db.transaction()
        await locks.start()
        await db.execute("SELECT 1 FROM outbox_messages FOR UPDATE")
        release.set()
        killer = asyncio.create_task(_terminate_lock_waiters_until(observer, run))
        failed = await run
        await killer
        await locks.rollback()
        _assert_clean_database_error(failed)
        assert (failed.processed, failed.unrecorded) == (0, MESSAGES)
        assert await statuses(db) == {"Processing": MESSAGES}  # safe under their leases

        await wait_for_leases_to_expire(db)
        recovered = await relay.processor.execute()  # same process, same pool
    assert (recovered.processed, recovered.error) == (MESSAGES, None)
    assert await statuses(db) == {"Processed": MESSAGES}
    hits = Counter(r.webhook_id for r in receiver.requests)
    # The first run's outcomes were lost, so each message went out again: unavoidable, bounded.
    assert hits == Counter({str(i): 2 for i in ids})
    assert await db.fetchval("SELECT array_agg(DISTINCT attempt_count) FROM outbox_messages") == [2]
    assert "ConnectionDoesNotExistError" in caplog.text


@pytest.mark.slow
async def test_database_unreachable_mid_drain_reports_a_clean_error_and_the_next_run_completes(
    db: Any,
    database_url: str,
    receiver: Receiver,
    make_settings: Any,
    proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    ids = await seed(db, MESSAGES)
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    settings = make_settings(
        database_url=through(proxy, database_url),
        batch_size=BATCH,
        concurrency=MESSAGES,
        lease_seconds=4,
        http_timeout_seconds=1.5,
    )
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await deliveries_in_flight(receiver, MESSAGES)
        proxy.down()  # the database host is gone while the webhooks are in flight
        release.set()
        failed = await run
        _assert_clean_database_error(failed)
        assert failed.unrecorded == MESSAGES
        assert proxy.refused > 1  # the outcome write was retried before giving up
        assert await statuses(db) == {"Processing": MESSAGES}

        proxy.up()
        await wait_for_leases_to_expire(db)
        recovered = await relay.processor.execute()
    assert (recovered.processed, recovered.error) == (MESSAGES, None)
    assert await statuses(db) == {"Processed": MESSAGES}
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert hits == Counter({str(i): 2 for i in ids})
    assert DB_PASSWORD not in caplog.text


async def test_an_outage_shorter_than_the_write_retries_loses_no_outcome(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any, proxy: TcpProxy
) -> None:
    ids = await seed(db, MESSAGES)
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    settings = make_settings(
        database_url=through(proxy, database_url), batch_size=BATCH, concurrency=MESSAGES
    )
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await deliveries_in_flight(receiver, MESSAGES)
        proxy.down()
        release.set()
        await eventually(lambda: proxy.refused >= 1)  # the first write attempt failed
        proxy.up()
        summary = await run
    assert (summary.processed, summary.unrecorded, summary.error) == (MESSAGES, 0, None)
    assert await statuses(db) == {"Processed": MESSAGES}
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert hits == Counter({str(i): 1 for i in ids})


def _assert_clean_database_error(summary: DrainSummary) -> None:
    assert summary.stopped_by == "error"
    assert summary.error is not None
    assert summary.error.startswith("database error: ")
    assert DB_PASSWORD not in summary.error
    assert "Traceback" not in summary.error


async def _terminate_lock_waiters_until(db: Any, run: asyncio.Task[DrainSummary]) -> None:
    """Terminate every relay backend that queues for the test's row locks, until ``run`` ends."""
    while not run.done():
        pid = await write_waiting_on_lock(db)
        if pid is not None:
            await terminate(db, [pid])
        await asyncio.sleep(0.02)


async def _eventually_value(probe: Any, timeout: float = 15) -> Any:
    found: list[Any] = []

    async def check() -> bool:
        value = await probe()
        if value is not None:
            found.append(value)
        return value is not None

    await eventually(check, timeout)
    return found[-1]


async def _differs(value: Any, other: Any) -> bool:
    found = await value
    return found is not None and found != other


async def test_a_write_on_a_connection_the_server_is_closing_is_retried_on_a_fresh_one(
    db: Any,
    database_url: str,
    receiver: Receiver,
    make_settings: Any,
    proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = await seed(db, 3)
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    settings = make_settings(database_url=through(proxy, database_url), concurrency=3)
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await deliveries_in_flight(receiver, 3)
        # The server terminates the pooled connection; the relay reads the termination notice
        # but (held by the proxy) not yet the end of the stream when it writes the outcomes.
        proxy.hold_closes()
        await terminate(db, await relay_backends(db))
        await eventually(lambda: proxy.closed_by_server >= 1)
        release.set()
        try:
            summary = await run
        finally:
            proxy.release_closes()
    assert (summary.processed, summary.unrecorded, summary.error) == (3, 0, None)
    assert await statuses(db) == {"Processed": 3}
    assert Counter(r.webhook_id for r in receiver.requests) == Counter({str(i): 1 for i in ids})
    # asyncpg refused the write before sending it; the store sent it on a new connection.
    assert "before a statement went out (InternalClientError)" in caplog.text


async def test_a_lease_on_a_connection_the_server_is_closing_goes_out_on_a_fresh_one(
    db: Any,
    database_url: str,
    receiver: Receiver,
    make_settings: Any,
    proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(database_url=through(proxy, database_url))
    async with open_relay(settings) as relay:
        assert (await relay.processor.execute()).leased == 0  # leaves a connection in the pool
        proxy.hold_closes()
        await terminate(db, await relay_backends(db))
        await eventually(lambda: proxy.closed_by_server >= 1)
        [message_id] = await seed(db)
        try:
            summary = await relay.processor.execute()
        finally:
            proxy.release_closes()
    # Before: the run ended with "database error: InternalClientError: cannot switch to state
    # 12; another operation (2) is in progress", and only the next run delivered.
    assert (summary.processed, summary.error) == (1, None)
    assert await statuses(db) == {"Processed": 1}
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    assert "before a statement went out (InternalClientError)" in caplog.text


async def test_a_statement_that_times_out_ends_the_run_with_an_error_that_says_so(
    db: Any, database_url: str, make_settings: Any
) -> None:
    await seed(db)
    settings = make_settings()
    pool = await asyncpg.create_pool(database_url, min_size=0, max_size=2, command_timeout=0.5)
    publisher = Publisher.from_settings(settings)
    try:
        async with db.transaction():
            # Nothing of the table can be read while this is held: the lease waits, then times out.
            await db.execute("LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE")
            summary = await OutboxProcessor(
                PostgresStore(pool), publisher.deliver, settings
            ).execute()
    finally:
        await publisher.close()
        await pool.close()
    assert summary.stopped_by == "error"
    # asyncpg raises a TimeoutError without a message; the summary says what it means.
    assert summary.error == (
        "database error: TimeoutError: no answer in time "
        "(the database or peer is overloaded, locked or unreachable)"
    )
    assert await statuses(db) == {"Pending": 1}


@pytest.mark.slow
async def test_a_database_that_comes_back_is_drained_within_a_minute_without_the_sweep(
    db: Any,
    database_url: str,
    receiver: Receiver,
    proxy: TcpProxy,
    queue_settings: QueueSettings,
    webhooks: dict[str, Any],
) -> None:
    assert queue_settings.queue_connection is not None
    storage = {
        "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
        "OUTBOX_QUEUE_NAME": queue_settings.queue_name,
    }
    env = relay_env(through(proxy, database_url), webhooks) | storage
    proxy.down()
    # The relay has no timers: only a wake-up hint can bring it back to the rows.
    serve = await Child.start(
        "outbox", "serve", "--port", str(free_port()), "--app",
        "tests.support.sweepless_app:app", env=env,
    )  # fmt: skip
    try:
        await serve.wait_for_line(r"outbox\.drain trigger=startup .*stopped_by=error")
        # A producer commits (its own connection works) and sends its hint: that run fails too.
        producer_env = {"OUTBOX_DATABASE_URL": database_url} | storage
        sent = await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=producer_env)
        assert json.loads(sent.stdout)["hint_sent"] is True
        await serve.wait_for_line(r"outbox\.drain trigger=queue .*stopped_by=error")
        proxy.up()
        # Each failed run left a hint due 30 s later; the first that comes finds it back.
        await receiver.wait_for(1, timeout=60)

        async def recorded() -> bool:
            return await statuses(db) == {"Processed": 1}

        await eventually(recorded)
    finally:
        await serve.kill()
    assert [r.json["data"] for r in receiver.requests] == [{"orderId": 1}]


def _http_requests() -> dict[str, tuple[Any, func.HttpRequest]]:
    """One request to each HTTP function, as the Functions host would pass it."""
    return {
        "drain": (
            relay_functions.outbox_drain,
            func.HttpRequest(method="POST", url="/api/outbox/drain", headers={}, body=b""),
        ),
        "status": (
            relay_functions.outbox_status,
            func.HttpRequest(method="GET", url="/api/outbox/status", headers={}, body=b""),
        ),
        "requeue": (
            relay_functions.outbox_requeue,
            func.HttpRequest(
                method="POST", url="/api/outbox/requeue", headers={}, body=b'{"all_failed": true}'
            ),
        ),
        # The operator's console: its read functions and an action.
        "overview": (
            relay_functions.outbox_overview,
            func.HttpRequest(method="GET", url="/api/outbox/overview", headers={}, body=b""),
        ),
        "messages": (
            relay_functions.outbox_messages,
            func.HttpRequest(
                method="GET", url="/api/outbox/messages?status=Failed", headers={}, body=b""
            ),
        ),
        "actions": (
            relay_functions.outbox_actions,
            func.HttpRequest(method="GET", url="/api/outbox/actions", headers={}, body=b""),
        ),
        "resume": (
            relay_functions.outbox_resume,
            func.HttpRequest(
                method="POST",
                url="/api/outbox/resume",
                headers={},
                body=b'{"event_type": "OrderCompleted", "endpoint": "OrderCompleted"}',
            ),
        ),
    }


async def test_every_http_function_answers_503_while_the_database_is_unreachable_then_recovers(
    database_url: str,
    app_env: None,
    proxy: TcpProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", through(proxy, database_url))
    for name, (function, request) in _http_requests().items():
        assert (await function(request)).status_code == 200, name  # a pooled connection each
    proxy.down()
    for name, (function, request) in _http_requests().items():
        response = await function(request)
        text = response.get_body().decode()
        assert response.status_code == 503, (name, text)
        error = json.loads(text)["error"]
        assert error == "database error; see the function logs", name
        assert "\n" not in error
        assert DB_PASSWORD not in text
    assert proxy.refused >= 1  # new connections were turned away, not only pooled ones cut
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info], "no traceback is logged"
    assert "misconfigured" not in caplog.text
    assert DB_PASSWORD not in caplog.text
    proxy.up()  # the same process and relay, nothing restarted
    for name, (function, request) in _http_requests().items():
        response = await function(request)
        assert response.status_code == 200, (name, response.get_body())
