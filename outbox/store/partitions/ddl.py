"""The partitioned layout's statements (``partitions.sql``), run by name through the store's
execution helpers, under a migration's statement timeout: a layout change may rewrite or index
millions of rows (its waits for locks are bounded by its lock timeout instead)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from outbox.store import connection
from outbox.store.connection import MIGRATION_STATEMENT_TIMEOUT_SECONDS, Connection
from outbox.store.partitions.naming import storage
from outbox.store.sql import fill, load

STATEMENTS = load("outbox.store.partitions", "partitions.sql")
_LONG = MIGRATION_STATEMENT_TIMEOUT_SECONDS

Part = str | tuple[str, ...] | datetime


def statement(which: str, /, **parts: Part) -> str:
    """Statement ``which`` with its names and times filled in (``store.sql.fill``)."""
    return fill(STATEMENTS[which], **parts)


def stored(which: str, /, table: str, **parts: Part) -> str:
    """Statement ``which`` that makes a table for ``table``, with ``table``'s storage
    parameters (``naming.storage``)."""
    return statement(which, table=table, **parts).removesuffix(";") + storage(table)


async def run(conn: Connection, text: str) -> None:
    """A statement made from a named one and more (a storage clause, an index's definition)."""
    await connection.execute(conn, text, statement_timeout=_LONG)


async def execute(conn: Connection, which: str, /, *args: Any, **parts: Part) -> int:
    """Run statement ``which``; the rows it touched."""
    return await connection.execute(conn, statement(which, **parts), *args, statement_timeout=_LONG)


async def fetchval(conn: Connection, which: str, /, *args: Any, **parts: Part) -> Any:
    return await connection.fetchval(
        conn, statement(which, **parts), *args, statement_timeout=_LONG
    )


async def fetchrow(conn: Connection, which: str, /, *args: Any, **parts: Part) -> Any:
    return await connection.fetchrow(
        conn, statement(which, **parts), *args, statement_timeout=_LONG
    )


async def fetch(conn: Connection, which: str, /, *args: Any, **parts: Part) -> list[Any]:
    return await connection.fetch(conn, statement(which, **parts), *args, statement_timeout=_LONG)
