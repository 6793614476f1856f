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
from dataclasses import dataclass
from typing import Any, NamedTuple

from outbox.core.errors import MigrationError
from outbox.store.connection import (
    MIGRATION_STATEMENT_TIMEOUT_SECONDS,
    Connection,
    database_boundary,
    execute,
    fetchval,
)
from outbox.store.sql import QUERIES, fill, identifier

# PostgreSQL's longest name (NAMEDATALEN - 1): a longer one is cut, silently.
MAX_NAME_LENGTH = 63


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


@dataclass(frozen=True, slots=True)
class IndexBuild:
    """``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS index ON table rest``, in its parts."""

    index: str
    table: str
    rest: str  # the columns and what follows them, as written
    unique: bool

    def statement(self, name: str, table: str, *, concurrently: bool, only: bool = False) -> str:
        """The build of index ``name`` on ``table`` (``ONLY``: a partitioned table's own index,
        without building any on its partitions)."""
        return (
            f"CREATE {'UNIQUE ' if self.unique else ''}INDEX "
            f"{'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS {identifier(name)} "
            f"ON {'ONLY ' if only else ''}{identifier(table)} {self.rest}"
        )

    def on_partition(self, partition: str) -> str:
        """Its name on ``partition``: the partition's name, then the index's after the table's
        (``outbox_messages_p20261207_due_idx`` for ``outbox_messages_due_idx``)."""
        own = self.index.removeprefix(self.table + "_")
        name = f"{partition}_{own}"
        if len(name) > MAX_NAME_LENGTH:
            raise MigrationError(
                f"index {self.index} on partition {partition} would be named {name!r}, longer "
                f"than PostgreSQL's {MAX_NAME_LENGTH} characters: give the index a shorter name"
            )
        return name


@database_boundary
async def apply_migration_alone(
    conn: Connection,
    name: str,
    sql: str,
    checksum: str,
    bookkeeping: Bookkeeping = RELAY_MIGRATIONS,
    index: str | None = None,
    *,
    build: IndexBuild | None = None,
    drop: str | None = None,
) -> None:
    """Run one statement that cannot run in a transaction (``CREATE INDEX CONCURRENTLY``), then
    record it. ``index``: the index it builds. A build that failed (here, or in a process that
    died) leaves that index INVALID, which ``IF NOT EXISTS`` would take for done: it is dropped
    first. Run again after a failure between the statement and its record, the statement finds
    its work done. On a partitioned table (``build``, ``drop``: the statement read) the index is
    built partition by partition (``build_partitioned_index``), and dropped without
    ``CONCURRENTLY``, which PostgreSQL refuses there: its table's lock for an instant, under
    the session's lock timeout."""
    if build is not None and await fetchval(conn, QUERIES["relation_kind"], build.table) == "p":
        await build_partitioned_index(conn, build)
    elif drop is not None and await fetchval(conn, QUERIES["relation_kind"], drop) == "I":
        await conn.execute(
            f"DROP INDEX IF EXISTS {identifier(drop)}",
            timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS,
        )
    elif index is not None:
        await build_index_concurrently(conn, index, sql)
    else:
        await conn.execute(sql, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)
    await conn.execute(bookkeeping.statement("record_migration"), name, checksum)


@database_boundary
async def build_partitioned_index(conn: Connection, build: IndexBuild) -> None:
    """``build`` on a partitioned table, as PostgreSQL's documentation advises: the table's own
    index first (``ON ONLY``: invalid, built on no partition, but every partition made from now
    on gets its own), then one built concurrently on each partition that has none (dropping an
    INVALID one a failed build left) and attached to it; valid once every partition has one.
    Producers and relays write throughout; run again after a failure, it goes on where it
    stopped."""
    timeout = MIGRATION_STATEMENT_TIMEOUT_SECONDS
    own = build.statement(build.index, build.table, concurrently=False, only=True)
    await conn.execute(own, timeout=timeout)
    for row in await conn.fetch(QUERIES["partitions_without_index"], build.table, build.index):
        partition = row["relname"]
        name = build.on_partition(partition)
        valid = await conn.fetchval(QUERIES["index_valid"], name)
        if valid is False:
            await conn.execute(
                f"DROP INDEX CONCURRENTLY IF EXISTS {identifier(name)}", timeout=timeout
            )
        if valid is not True:
            statement = build.statement(name, partition, concurrently=True)
            await conn.execute(statement, timeout=timeout)
        await conn.execute(
            f"ALTER INDEX {identifier(build.index)} ATTACH PARTITION {identifier(name)}",
            timeout=timeout,
        )
    if not await conn.fetchval(QUERIES["index_valid"], build.index):
        raise MigrationError(
            f"index {build.index} is not valid yet: a partition of {build.table} has none "
            "attached (made or dropped meanwhile?); run migrate again"
        )


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
