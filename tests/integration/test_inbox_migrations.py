"""migrate_inbox: the consumer inbox's own migrations, record and lock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox.core.errors import MigrationError
from outbox.store.migrate import INBOX_MIGRATIONS_DIR, discover, migrate, migrate_inbox
from tests.support import pg


@pytest.fixture
async def empty_db(admin_dsn: str) -> AsyncIterator[str]:
    name = pg.unique_name("outbox_consumer")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    yield pg.with_database(admin_dsn, name)
    await pg.drop(admin_dsn, name)


async def tables(conn: Any) -> set[str]:
    rows = await conn.fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    )
    return {row["table_name"] for row in rows}


async def test_migrate_inbox_creates_the_inbox_and_nothing_of_the_relay_s(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        assert await migrate_inbox(conn) == ["0001_create_outbox_inbox.sql"]
        assert await tables(conn) == {"outbox_inbox", "outbox_inbox_migrations"}
        columns = await conn.fetch(
            "SELECT column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_name = 'outbox_inbox' "
            "ORDER BY ordinal_position"
        )
        assert [tuple(c) for c in columns] == [
            ("webhook_id", "text", "NO", None),
            ("received_at", "timestamp with time zone", "NO", "now()"),
        ]
        key = await conn.fetchval(
            "SELECT string_agg(a.attname, ',') FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) "
            "WHERE i.indrelid = 'outbox_inbox'::regclass AND i.indisprimary"
        )
        assert key == "webhook_id"
    finally:
        await conn.close()


async def test_migrate_inbox_twice_applies_nothing_the_second_time(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        assert await migrate_inbox(conn)
        assert await migrate_inbox(conn) == []
        recorded = await conn.fetchval("SELECT count(*) FROM outbox_inbox_migrations")
        assert recorded == len(discover(INBOX_MIGRATIONS_DIR))
    finally:
        await conn.close()


async def test_concurrent_inbox_migrators_apply_each_migration_once(empty_db: str) -> None:
    conns = [await asyncpg.connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate_inbox(c) for c in conns))
        expected = len(discover(INBOX_MIGRATIONS_DIR))
        assert sorted(len(r) for r in results) == [0, 0, 0, expected]
        assert await conns[0].fetchval("SELECT count(*) FROM outbox_inbox_migrations") == expected
    finally:
        for conn in conns:
            await conn.close()


async def test_the_relay_and_the_inbox_migrate_side_by_side_in_one_database(
    empty_db: str,
) -> None:
    # A service that produces and consumes keeps both; each set has its record and its lock.
    conns = [await asyncpg.connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(
            migrate(conns[0]), migrate_inbox(conns[1]), migrate(conns[2]), migrate_inbox(conns[3])
        )
        assert sorted(map(len, results)) == sorted(
            [0, 0, len(discover()), len(discover(INBOX_MIGRATIONS_DIR))]
        )
        names = await conns[0].fetch("SELECT name FROM outbox_migrations")
        assert len(names) == len(discover())
        inbox = await conns[0].fetch("SELECT name FROM outbox_inbox_migrations")
        assert [r["name"] for r in inbox] == [m.name for m in discover(INBOX_MIGRATIONS_DIR)]
        assert {"outbox_messages", "outbox_inbox"} <= await tables(conns[0])
    finally:
        for conn in conns:
            await conn.close()


async def test_an_edited_inbox_migration_is_refused(empty_db: str, tmp_path: Path) -> None:
    for source in discover(INBOX_MIGRATIONS_DIR):
        (tmp_path / source.name).write_text(source.sql)
    conn = await asyncpg.connect(empty_db)
    try:
        await migrate_inbox(conn, tmp_path)
        first = sorted(tmp_path.glob("*.sql"))[0]
        first.write_text(first.read_text() + "\n-- edited\n")
        with pytest.raises(MigrationError, match=f"{first.name} was edited after it was applied"):
            await migrate_inbox(conn, tmp_path)
    finally:
        await conn.close()
