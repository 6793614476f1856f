"""The statements of a schema change: the migrations' bookkeeping, an index built concurrently,
the sessions whose locks a change waits for. ``migrate`` and the partitioned layout's changes run
them.

One set of bookkeeping statements serves both sets of migrations, the relay's
(``outbox_migrations``) and the consumer inbox's (``outbox_inbox_migrations``): each set names
its table and the key of the advisory lock that serialises its migrators (``Bookkeeping``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

from outbox.store.connection import (
    MIGRATION_STATEMENT_TIMEOUT_SECONDS,
    Connection,
    database_boundary,
    execute,
    fetchval,
)
from outbox.store.sql import QUERIES, fill, identifier


class Bookkeeping(NamedTuple):
    """One set of migrations: the table that records them and the key of its migrators' lock."""

    table: str
    lock_key: str

    def statement(self, name: str) -> str:
        """The bookkeeping statement ``name`` of ``queries.sql`` for this set."""
        return fill(QUERIES[name], table=identifier(self.table))


RELAY_MIGRATIONS = Bookkeeping("outbox_migrations", lock_key="outbox_migrations")
INBOX_MIGRATIONS = Bookkeeping("outbox_inbox_migrations", lock_key="outbox_inbox_migrations")


@asynccontextmanager
async def migration_lock(
    conn: Connection, bookkeeping: Bookkeeping = RELAY_MIGRATIONS, lock_timeout: str = "0"
) -> AsyncIterator[None]:
    """Serialise migrators (a session-level advisory lock), with the bookkeeping table made.

    Inside, every statement waits at most ``lock_timeout`` (PostgreSQL's syntax, ``'2s'``) for a
    lock; the session's own setting is put back afterwards. The advisory lock is tried every
    0.1 s until taken: no waiter sits in a statement meanwhile (a waiting statement holds a
    snapshot, which the holder's ``CREATE INDEX CONCURRENTLY`` would wait for), nor holds a lock
    of a table."""
    while True:
        if await fetchval(conn, QUERIES["lock_migrations"], bookkeeping.lock_key):
            break
        await asyncio.sleep(0.1)
    try:
        previous = await fetchval(conn, QUERIES["show_lock_timeout"])
        await fetchval(conn, QUERIES["set_lock_timeout"], lock_timeout)
        try:
            await execute(conn, bookkeeping.statement("create_migrations_table"))
            yield
        finally:
            await fetchval(conn, QUERIES["set_lock_timeout"], previous)
    finally:
        await fetchval(conn, QUERIES["unlock_migrations"], bookkeeping.lock_key)


@database_boundary
async def applied_migrations(
    conn: Connection, bookkeeping: Bookkeeping = RELAY_MIGRATIONS
) -> dict[str, str]:
    """The migrations applied so far, with the checksum each had."""
    rows = await conn.fetch(bookkeeping.statement("applied_migrations"))
    return {row["name"]: row["checksum"] for row in rows}


@database_boundary
async def apply_migration(
    conn: Connection,
    name: str,
    sql: str,
    checksum: str,
    bookkeeping: Bookkeeping = RELAY_MIGRATIONS,
) -> None:
    """Run one migration and record it, in one transaction."""
    async with conn.transaction():
        await conn.execute(sql, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)
        await conn.execute(bookkeeping.statement("record_migration"), name, checksum)


@database_boundary
async def apply_migration_alone(
    conn: Connection,
    name: str,
    sql: str,
    checksum: str,
    bookkeeping: Bookkeeping = RELAY_MIGRATIONS,
    index: str | None = None,
) -> None:
    """Run one statement that cannot run in a transaction (``CREATE INDEX CONCURRENTLY``), then
    record it. ``index``: the index it builds. A build that failed (here, or in a process that
    died) leaves that index INVALID, which ``IF NOT EXISTS`` would take for done: it is dropped
    first. Run again after a failure between the statement and its record, the statement finds
    its work done."""
    if index is not None:
        await build_index_concurrently(conn, index, sql)
    else:
        await conn.execute(sql, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)
    await conn.execute(bookkeeping.statement("record_migration"), name, checksum)


@database_boundary
async def build_index_concurrently(conn: Connection, index: str, statement: str) -> None:
    """Run ``statement`` (``CREATE INDEX CONCURRENTLY IF NOT EXISTS index``), dropping first an
    INVALID ``index`` left by a build that failed or whose process died, which ``IF NOT EXISTS``
    would take for done."""
    invalid = await conn.fetchval(QUERIES["invalid_index"], index)
    if invalid is not None:
        await conn.execute(
            f"DROP INDEX CONCURRENTLY IF EXISTS {invalid}",
            timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS,
        )
    await conn.execute(statement, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)


@database_boundary
async def lock_holders(conn: Connection) -> list[dict[str, Any]]:
    """Other sessions that hold a lock on an outbox table or index, oldest transaction first:
    ``pid``, ``application_name``, ``xact_start``, ``seconds`` (in their transaction)."""
    return [dict(row) for row in await conn.fetch(QUERIES["lock_holders"])]


@database_boundary
async def lock_holders_remaining(conn: Connection, holders: Sequence[dict[str, Any]]) -> int:
    """How many of ``holders`` (from ``lock_holders``) are still in the same transaction."""
    pids = [holder["pid"] for holder in holders]
    starts = [holder["xact_start"] for holder in holders]
    remaining: int = await conn.fetchval(QUERIES["lock_holders_remaining"], pids, starts)
    return remaining
