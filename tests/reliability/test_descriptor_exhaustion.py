"""The relay short of its own resources: ``serve`` choked by idle connections, deliveries that
fail for want of a file descriptor. Neither is the receiver's doing: its breaker stays closed, no
attempt is spent, and delivery resumes within seconds of the shortage ending."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from outbox.core.settings import QueueSettings
from outbox.hosting.connections import ACCEPT_ERROR_LOG_INTERVAL_SECONDS, HEADER_TIMEOUT_SECONDS
from outbox.relay.breakers import THRESHOLD
from outbox.transport.publisher import OWN_ERROR_RETRY_SECONDS
from tests.acceptance.test_serve import clear_of_the_timers
from tests.support.azure import free_port
from tests.support.outbox_helpers import eventually, open_relay, run_cli, seed, statuses
from tests.support.processes import Child
from tests.support.receiver import Receiver

KEY = "exhaustion-test-function-key-0123456789"


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """This process can open no file descriptor (EMFILE) until the block ends.

    Every free descriptor number below the highest in use is taken, then the soft limit is set
    just above them; the descriptors already open keep working.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
        while not fillers or fillers[-1] < highest:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (fillers[-1] + 1, hard))
        with pytest.raises(OSError, match="Too many open files") as refused:
            socket.socket().close()
        assert refused.value.errno == errno.EMFILE
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)


async def test_deliveries_failing_for_want_of_descriptors_spend_no_attempt_nor_open_the_breaker(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # More messages than the failures that open a breaker: had EMFILE counted against the
    # endpoint, its breaker would be open and every message would have spent an attempt.
    count = THRESHOLD + 5
    await seed(db, count)
    settings = make_settings(db_pool_size=4)
    async with open_relay(settings) as relay:
        # The pool's connections opened now: while descriptors are short it can open none.
        async with contextlib.AsyncExitStack() as held:
            for _ in range(settings.db_pool_size):
                await held.enter_async_context(relay.pool.acquire())
        with descriptors_exhausted():
            summary = await relay.processor.execute()
        assert receiver.requests == []
        assert (summary.processed, summary.retried, summary.failed) == (0, 0, 0)
        rows = await db.fetch(
            "SELECT status, attempt_count, last_error, "
            "extract(epoch FROM next_attempt_at - now())::float8 AS due_in FROM outbox_messages"
        )
        assert {(r["status"], r["attempt_count"], r["last_error"]) for r in rows} == {
            ("Pending", 0, None)
        }
        # Due again in seconds, not after a backoff.
        assert all(0 < r["due_in"] <= OWN_ERROR_RETRY_SECONDS for r in rows)
        opened = await db.fetchval(
            "SELECT count(*) FROM outbox_endpoints WHERE consecutive_failures > 0 OR opens > 0"
        )
        assert opened == 0
        assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 0

        # Descriptors back: the messages go at their next due time, each on its first attempt.
        await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
        summary = await relay.processor.execute()
    assert summary.processed == count
    assert len(receiver.requests) == count
    assert await statuses(db) == {"Processed": count}
    assert await db.fetchval("SELECT max(attempt_count) FROM outbox_messages") == 1


DESCRIPTOR_LIMIT = 256  # serve's RLIMIT_NOFILE in these tests: its default cap is a quarter
IDLE_CLIENTS = 300  # more than the cap, and more than the whole descriptor limit


def low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTOR_LIMIT, DESCRIPTOR_LIMIT))


@pytest.fixture
def serve_env(
    database_url: str, webhooks: dict[str, Any], queue_settings: QueueSettings
) -> dict[str, str]:
    assert queue_settings.queue_connection is not None
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(webhooks),
        "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
        "OUTBOX_QUEUE_NAME": queue_settings.queue_name,
        "OUTBOX_FUNCTION_KEY": KEY,
    }


@contextlib.asynccontextmanager
async def serving(serve_env: dict[str, str], *options: str) -> AsyncIterator[tuple[Child, int]]:
    """``outbox serve`` with at most DESCRIPTOR_LIMIT descriptors; its port."""
    await clear_of_the_timers()
    port = free_port()
    child = await Child.start(
        "outbox",
        "serve",
        "--port",
        str(port),
        *options,
        env=serve_env,
        preexec_fn=low_descriptor_limit,
    )
    try:
        await child.wait_for_line(r"serving 18 functions")
        await child.wait_for_line(r"outbox\.drain trigger=startup")
        yield child, port
    finally:
        await child.kill()


class IdleClients:
    """Connections that are opened and never send a byte."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []

    async def open(self, port: int, count: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(count):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            self.sockets.append(sock)

    def still_open(self) -> int:
        """How many the server has not closed (a closed one reads as EOF or a reset)."""
        open_ = 0
        for sock in self.sockets:
            try:
                open_ += sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                open_ += 1
            except ConnectionResetError:
                pass
        return open_

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


@contextlib.contextmanager
def idle_clients() -> Iterator[IdleClients]:
    clients = IdleClients()
    try:
        yield clients
    finally:
        clients.close()


def open_sockets(pid: int) -> int:
    """How many sockets process ``pid`` has open."""
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while we looked
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
    return count


async def api_status(port: int) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{port}/api/outbox/status", headers={"x-functions-key": KEY}
        ) as response,
    ):
        return response.status


@pytest.mark.slow
async def test_serve_keeps_idle_connections_at_its_cap_and_closes_them_after_the_header_timeout(
    db: Any, receiver: Receiver, serve_env: dict[str, str]
) -> None:
    cap = DESCRIPTOR_LIMIT // 4
    async with serving(serve_env) as (child, port):
        assert any(f"at most {cap} connections" in line for line in child.lines)
        pid = child.process.pid
        before = open_sockets(pid)
        with idle_clients() as clients:
            await clients.open(port, IDLE_CLIENTS)
            # Each connection above the cap closed the oldest idle one: once every one has been
            # accepted, exactly the cap are left open.
            await eventually(lambda: clients.still_open() == cap, timeout=30)
            # serve's own sockets: the cap's, and what it had before give or take a few (a queue
            # poll, a pool connection opening or closing; never the hundreds of the attack).
            assert open_sockets(pid) <= before + cap + 8
            # The relay still works while they hold: a request (its connection takes the
            # oldest idle one's place) and a delivery through the hint path.
            assert await api_status(port) == 200
            await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=serve_env)
            await receiver.wait_for(1, timeout=30)
            # None of them sends a request's headers: all are closed after the header timeout.
            await eventually(lambda: clients.still_open() == 0, timeout=HEADER_TIMEOUT_SECONDS * 3)
        assert await statuses(db) == {"Processed": 1}


@pytest.mark.slow
async def test_serve_out_of_descriptors_logs_accept_errors_throttled_and_delivers_after(
    db: Any, receiver: Receiver, serve_env: dict[str, str]
) -> None:
    # A cap above the descriptor limit: the idle clients take every descriptor serve has.
    async with serving(serve_env, "--max-connections", "1000") as (child, port):
        started = time.monotonic()
        with idle_clients() as clients:
            await clients.open(port, IDLE_CLIENTS)
            await child.wait_for_line(r"cannot accept connections: .*EMFILE", timeout=30)
            for order in range(3):
                await run_cli("enqueue", "OrderCompleted", f'{{"orderId": {order}}}', env=serve_env)
            # Every idle client is closed after the header timeout (those waiting in the listen
            # backlog once accepted, a timeout later), and the messages go.
            await eventually(lambda: clients.still_open() == 0, timeout=HEADER_TIMEOUT_SECONDS * 5)
            await receiver.wait_for(3, timeout=30)
        elapsed = time.monotonic() - started
        assert await api_status(port) == 200
    assert await statuses(db) == {"Processed": 3}
    # No attempt spent, and nothing counted against the receiver, for the relay's own errors.
    assert await db.fetchval("SELECT max(attempt_count) FROM outbox_messages") == 1
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints WHERE opens > 0") == 0
    # One line at the first error, then at most one per interval (plus one for an interval
    # begun as the test ended); no traceback.
    accept_lines = [line for line in child.lines if "cannot accept connections" in line]
    assert 1 <= len(accept_lines) <= 2 + elapsed // ACCEPT_ERROR_LOG_INTERVAL_SECONDS
    assert not any("Traceback" in line or "socket.accept()" in line for line in child.lines)
