"""pytest fixtures for your own tests (opt-in: ``pytest_plugins = ["outbox.pytest_plugin"]`` in
your ``conftest.py``).

- ``outbox_database_url``: the URL of a fresh database with the outbox's tables (every migration
  applied), dropped after the test. The schema is migrated once per session into a template
  database, and each test gets a copy of it (``CREATE DATABASE … TEMPLATE``), which takes
  milliseconds.

The server is the one ``OUTBOX_TEST_ADMIN_DSN`` names: a URL of a role that may create databases
(default ``postgresql://postgres@127.0.0.1:5432/postgres``). Synchronous fixtures: they work with
any test style (pytest-asyncio, anyio, or plain functions).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

DEFAULT_ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_dsn() -> str:
    return os.environ.get("OUTBOX_TEST_ADMIN_DSN", DEFAULT_ADMIN_DSN)


@pytest.fixture(scope="session")
def outbox_template_database() -> Iterator[str]:
    """A database migrated once for the session: each test's is a copy of it. Its name."""
    name = f"outbox_template_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_create(name, template=None))
    try:
        yield name
    finally:
        asyncio.run(_drop(name))


@pytest.fixture
def outbox_database_url(outbox_template_database: str) -> Iterator[str]:
    """A fresh database with the outbox's tables, dropped after the test: its URL."""
    name = f"outbox_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_create(name, template=outbox_template_database))
    try:
        yield with_database(admin_dsn(), name)
    finally:
        asyncio.run(_drop(name))


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database of the same server."""
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


async def _create(name: str, *, template: str | None) -> None:
    import asyncpg  # noqa: PLC0415 - the relay's own driver, loaded when a fixture runs

    conn = await asyncpg.connect(admin_dsn())
    try:
        copy = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await conn.close()
    if template is None:
        from outbox.store.migrate import migrate  # noqa: PLC0415

        target = await asyncpg.connect(with_database(admin_dsn(), name))
        try:
            await migrate(target)
        finally:
            await target.close()


async def _drop(name: str) -> None:
    import asyncpg  # noqa: PLC0415

    conn = await asyncpg.connect(admin_dsn())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
