"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
from azure.core.exceptions import ResourceNotFoundError

import outbox
from outbox.core.settings import QueueSettings, Settings
from outbox.relay.runtime import Relay
from outbox.transport.wakeup import WakeUpQueue

ROOT = Path(__file__).resolve().parents[2]


async def seed(
    conn: Any,
    count: int = 1,
    event_type: str = "OrderCompleted",
    payload: Callable[[int], dict[str, Any]] = lambda i: {"orderId": i},
) -> list[uuid.UUID]:
    """Enqueue ``count`` events in one committed transaction, as a producer would."""
    async with conn.transaction():
        return [await outbox.enqueue(conn, event_type, payload(i)) for i in range(count)]


@asynccontextmanager
async def steady_arrivals(
    database_url: str, every: float = 0.01, *, keyed: bool = False
) -> AsyncIterator[None]:
    """A producer committing one event every ``every`` seconds for as long as the block runs
    (``keyed``: each with an ordering key of its own)."""
    conn = await asyncpg.connect(database_url)
    arriving = True

    async def produce() -> None:
        while arriving:
            async with conn.transaction():
                key = f"order-{uuid.uuid4()}" if keyed else None
                await outbox.enqueue(conn, "OrderCompleted", {"n": 1}, ordering_key=key)
            await asyncio.sleep(every)

    producer = asyncio.create_task(produce())
    try:
        yield
    finally:
        arriving = False
        await producer
        await conn.close()


@asynccontextmanager
async def open_relay(settings: Settings) -> AsyncIterator[Relay]:
    relay = await Relay.open(settings)
    try:
        yield relay
    finally:
        await relay.close()


async def row(conn: Any, message_id: uuid.UUID) -> Any:
    return await conn.fetchrow(
        "SELECT *, extract(epoch FROM next_attempt_at - now())::float8 AS due_in "
        "FROM outbox_messages WHERE outbox_message_id = $1",
        message_id,
    )


async def statuses(conn: Any) -> dict[str, int]:
    rows = await conn.fetch("SELECT status, count(*) AS n FROM outbox_messages GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 15) -> None:
    """Poll ``check`` (a plain or an async condition) until it is true; fail after ``timeout``
    seconds."""
    deadline = time.monotonic() + timeout
    while not await _holds(check):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def _holds(check: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = check()
    return await result if inspect.isawaitable(result) else result


async def peek_hints(queue_settings: QueueSettings) -> list[dict[str, Any]]:
    """The hints waiting on the queue, decoded the way the queue trigger decodes them."""
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        try:
            messages = await queue.client.peek_messages(max_messages=32)
        except ResourceNotFoundError:
            return []
    return [json.loads(m.content) for m in messages]


async def run_cli(
    *args: str, env: dict[str, str], module: str = "outbox"
) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env={"PATH": os.environ["PATH"], **env},
            stdin=subprocess.DEVNULL,  # no terminal: a bulk action needs --yes, as in a script
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    # Off the event loop: the receiver in this process must keep answering meanwhile.
    return await asyncio.to_thread(run)


async def seed_many(conn: Any, count: int, event_type: str = "OrderCompleted") -> list[uuid.UUID]:
    """Insert ``count`` Pending rows in one statement (what thousands of producers would leave)."""
    rows = await conn.fetch(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "SELECT gen_random_uuid(), $1, jsonb_build_object('n', n) FROM generate_series(1, $2) n "
        "RETURNING outbox_message_id",
        event_type,
        count,
    )
    return [r["outbox_message_id"] for r in rows]


async def wait_for_leases_to_expire(conn: Any, timeout: float = 30) -> None:
    """Poll the database's clock until no row is held under a lease that is still valid."""
    await eventually(
        lambda: conn.fetchval(
            "SELECT count(*) = 0 FROM outbox_messages "
            "WHERE status = 'Processing' AND lease_expires_at > now()"
        ),
        timeout,
    )


async def queued_hints(queue_settings: QueueSettings) -> int:
    """Every hint on the queue, visible or not yet (the queue's approximate count)."""
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        try:
            properties = await queue.client.get_queue_properties()
        except ResourceNotFoundError:
            return 0
    return int(properties.approximate_message_count or 0)
