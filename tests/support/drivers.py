"""Every kind of connection the producer and the inbox take, behind one async test interface.

A harness opens a real connection (or session) of its kind to the test's database and offers what
a caller does with it: open a transaction, run a business statement, ``enqueue``, ``claim``,
``transaction``. Synchronous kinds run each call in a worker thread, so that a test can let one
of them wait on a lock while the event loop goes on.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
import outbox.inbox
import outbox.sync
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import WakeUpQueue


class Harness:
    """One connection or session of a kind, as a caller of the outbox uses it."""

    sync = False

    def __init__(
        self,
        name: str,
        target: object,
        begin: Callable[[], Any],
        execute: Callable[[str], Any],
        close: Callable[[], Any],
        finish: Callable[[bool], Any] | None = None,
    ) -> None:
        self.name = name
        self.target = target  # what is passed to enqueue and claim
        self._begin = begin
        self._execute = execute
        self._close = close
        self._finish = finish

    def begin(self) -> AbstractAsyncContextManager[Any]:
        """The caller's own transaction (``conn.transaction()``, ``session.begin()``)."""
        begun: AbstractAsyncContextManager[Any] = self._begin()
        return begun

    async def execute(self, sql: str) -> None:
        await self._execute(sql)

    async def finish(self, commit: bool) -> None:
        """End a transaction the driver began by itself (psycopg, SQLAlchemy): commit or not."""
        assert self._finish is not None, f"{self.name} begins no transaction by itself"
        await self._finish(commit)

    async def enqueue(self, *args: Any, **kwargs: Any) -> UUID:
        return await outbox.enqueue(self.target, *args, **kwargs)

    async def claim(self, webhook_id: str) -> bool:
        return await outbox.inbox.claim(self.target, webhook_id)

    @asynccontextmanager
    async def transaction(self, queue_settings: QueueSettings) -> AsyncIterator[Any]:
        async with (
            WakeUpQueue.from_settings(queue_settings) as queue,
            outbox.transaction(self.target, queue) as tx,
        ):
            yield tx

    async def close(self) -> None:
        await self._close()


class SyncHarness(Harness):
    """A synchronous kind: every call runs in a worker thread."""

    sync = True

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[None]:  # type: ignore[override]
        async with _in_threads(self._begin()):
            yield

    async def execute(self, sql: str) -> None:
        await asyncio.to_thread(self._execute, sql)

    async def finish(self, commit: bool) -> None:
        assert self._finish is not None
        await asyncio.to_thread(self._finish, commit)

    async def enqueue(self, *args: Any, **kwargs: Any) -> UUID:
        call = functools.partial(outbox.sync.enqueue, self.target, *args, **kwargs)
        return await asyncio.to_thread(call)

    async def claim(self, webhook_id: str) -> bool:
        return await asyncio.to_thread(outbox.sync.claim, self.target, webhook_id)

    @asynccontextmanager
    async def transaction(self, queue_settings: QueueSettings) -> AsyncIterator[Any]:
        queue = outbox.sync.WakeUpQueue.from_settings(queue_settings)
        try:
            async with _in_threads(outbox.sync.transaction(self.target, queue)) as tx:
                yield _ThreadedTransaction(tx)
        finally:
            queue.close()

    async def close(self) -> None:
        await asyncio.to_thread(self._close)


class _ThreadedTransaction:
    def __init__(self, tx: outbox.sync.OutboxTransaction) -> None:
        self._tx = tx

    async def enqueue(self, *args: Any, **kwargs: Any) -> UUID:
        return await asyncio.to_thread(functools.partial(self._tx.enqueue, *args, **kwargs))


@asynccontextmanager
async def _in_threads(manager: AbstractContextManager[Any]) -> AsyncIterator[Any]:
    """A synchronous context manager entered and left in worker threads."""
    value = await asyncio.to_thread(manager.__enter__)
    try:
        yield value
    except BaseException as exc:
        if not await asyncio.to_thread(manager.__exit__, type(exc), exc, exc.__traceback__):
            raise
    else:
        await asyncio.to_thread(manager.__exit__, None, None, None)


def sqlalchemy_url(database_url: str, driver: str) -> str:
    return database_url.replace("postgresql://", f"postgresql+{driver}://", 1)


async def asyncpg_connection(url: str, autocommit: bool) -> Harness:
    conn = await asyncpg.connect(url)
    return Harness("asyncpg", conn, conn.transaction, conn.execute, conn.close)


async def asyncpg_pool_connection(url: str, autocommit: bool) -> Harness:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    conn = await pool.acquire()

    async def close() -> None:
        await pool.release(conn)
        await pool.close()

    return Harness("asyncpg pool", conn, conn.transaction, conn.execute, close)


async def psycopg_async_connection(url: str, autocommit: bool) -> Harness:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=autocommit)

    async def finish(commit: bool) -> None:
        await (conn.commit() if commit else conn.rollback())

    return Harness("psycopg async", conn, conn.transaction, conn.execute, conn.close, finish)


def _async_sqlalchemy(driver: str, *, session: bool) -> Callable[[str, bool], Awaitable[Harness]]:
    async def make(url: str, autocommit: bool) -> Harness:
        options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        engine = create_async_engine(sqlalchemy_url(url, driver), **options)
        target: Any = AsyncSession(engine) if session else await engine.connect()

        async def execute(sql: str) -> None:
            await target.execute(text(sql))

        async def finish(commit: bool) -> None:
            await (target.commit() if commit else target.rollback())

        async def close() -> None:
            await target.close()
            await engine.dispose()

        kind = "AsyncSession" if session else "AsyncConnection"
        return Harness(f"{kind} {driver}", target, target.begin, execute, close, finish)

    return make


async def psycopg_connection(url: str, autocommit: bool) -> Harness:
    conn = await asyncio.to_thread(psycopg.connect, url, autocommit=autocommit)

    def finish(commit: bool) -> None:
        conn.commit() if commit else conn.rollback()

    return SyncHarness("psycopg", conn, conn.transaction, conn.execute, conn.close, finish)


def _sync_sqlalchemy(driver: str, *, session: bool) -> Callable[[str, bool], Awaitable[Harness]]:
    async def make(url: str, autocommit: bool) -> Harness:
        options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        engine = create_engine(sqlalchemy_url(url, driver), **options)
        target: Any = Session(engine) if session else await asyncio.to_thread(engine.connect)

        def execute(sql: str) -> None:
            target.execute(text(sql))

        def finish(commit: bool) -> None:
            target.commit() if commit else target.rollback()

        def close() -> None:
            target.close()
            engine.dispose()

        kind = "Session" if session else "Connection"
        return SyncHarness(f"{kind} {driver}", target, target.begin, execute, close, finish)

    return make


Factory = Callable[[str, bool], Awaitable[Harness]]
ASYNC_KINDS: dict[str, Factory] = {
    "asyncpg": asyncpg_connection,
    "asyncpg pool": asyncpg_pool_connection,
    "psycopg async": psycopg_async_connection,
    "AsyncSession asyncpg": _async_sqlalchemy("asyncpg", session=True),
    "AsyncSession psycopg": _async_sqlalchemy("psycopg", session=True),
    "AsyncConnection asyncpg": _async_sqlalchemy("asyncpg", session=False),
    "AsyncConnection psycopg": _async_sqlalchemy("psycopg", session=False),
}
SYNC_KINDS: dict[str, Factory] = {
    "psycopg": psycopg_connection,
    "Session psycopg": _sync_sqlalchemy("psycopg", session=True),
    "Session psycopg2": _sync_sqlalchemy("psycopg2", session=True),
    "Connection psycopg": _sync_sqlalchemy("psycopg", session=False),
}
KINDS: dict[str, Factory] = {**ASYNC_KINDS, **SYNC_KINDS}
# The kinds whose driver begins a transaction with the first statement, outside autocommit mode.
IMPLICIT_KINDS = [name for name in KINDS if not name.startswith("asyncpg")]
