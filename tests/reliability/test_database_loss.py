"""The database goes away mid-drain: backends terminated, or the server unreachable for a while.

The relay runs in the test's process with its real pool, so "the next run" is the same process
reusing the same pool, as a Functions worker would.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from outbox.models import DrainSummary
from tests.support.outbox_helpers import (
    eventually,
    open_relay,
    seed,
    statuses,
)
from tests.support.receiver import Receiver, Reply
from tests.support.tcp_proxy import TcpProxy

MESSAGES = 10
DB_PASSWORD = "db-pw-must-never-leak"  # the test server ignores it (trust auth)


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[TcpProxy]:
    parts = urlsplit(database_url)
    server = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield server
    await server.stop()


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


async def deliveries_in_flight(receiver: Receiver, count: int) -> None:
    await eventually(lambda: _true(receiver.in_flight == count), timeout=30)


def _assert_clean_database_error(summary: DrainSummary) -> None:
    assert summary.stopped_by == "error"
    assert summary.error is not None
    assert summary.error.startswith("database error: ")
    assert DB_PASSWORD not in summary.error
    assert "Traceback" not in summary.error


async def _true(value: bool) -> bool:
    return value


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
        await eventually(lambda: _true(proxy.closed_by_server >= 1))
        release.set()
        try:
            summary = await run
        finally:
            proxy.release_closes()
    assert (summary.processed, summary.unrecorded, summary.error) == (3, 0, None)
    assert await statuses(db) == {"Processed": 3}
    assert Counter(r.webhook_id for r in receiver.requests) == Counter({str(i): 1 for i in ids})
    assert "database write failed (InternalClientError)" in caplog.text


async def test_a_lease_on_a_connection_the_server_is_closing_ends_the_run_with_a_clean_error(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any, proxy: TcpProxy
) -> None:
    settings = make_settings(database_url=through(proxy, database_url))
    async with open_relay(settings) as relay:
        assert (await relay.processor.execute()).leased == 0  # leaves a connection in the pool
        proxy.hold_closes()
        await terminate(db, await relay_backends(db))
        await eventually(lambda: _true(proxy.closed_by_server >= 1))
        [message_id] = await seed(db)
        try:
            failed = await relay.processor.execute()
        finally:
            proxy.release_closes()
        _assert_clean_database_error(failed)
        assert failed.leased == 0
        recovered = await relay.processor.execute()
    assert (recovered.processed, recovered.error) == (1, None)
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
