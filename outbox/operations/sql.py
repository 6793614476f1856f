"""The operators' statements (``queries.sql`` beside this module), run by name through the
store's execution helpers: each a ``DatabaseError`` on a driver error, each row a dict."""

from __future__ import annotations

from typing import Any

from outbox.store import connection
from outbox.store.connection import Connection
from outbox.store.sql import load

QUERIES = load("outbox.operations", "queries.sql")


async def rows(conn: Connection, name: str, *args: Any) -> list[dict[str, Any]]:
    """The rows statement ``name`` returns."""
    return [dict(row) for row in await connection.fetch(conn, QUERIES[name], *args)]


async def row(conn: Connection, name: str, *args: Any) -> dict[str, Any] | None:
    """The first row statement ``name`` returns, if any."""
    found = await connection.fetchrow(conn, QUERIES[name], *args)
    return None if found is None else dict(found)


async def value(conn: Connection, name: str, *args: Any) -> Any:
    """The first column of the first row statement ``name`` returns (None: no row)."""
    return await connection.fetchval(conn, QUERIES[name], *args)


async def execute(conn: Connection, name: str, *args: Any) -> int:
    """Run statement ``name``; the rows it touched."""
    return await connection.execute(conn, QUERIES[name], *args)
