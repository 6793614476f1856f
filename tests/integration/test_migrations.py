from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox.errors import MigrationError
from outbox.migrate import MIGRATIONS_DIR, discover, migrate
from outbox.store import QUERIES
from tests.support import pg


@pytest.fixture
async def empty_db(admin_dsn: str) -> Any:
    name = pg.unique_name("outbox_empty")
    conn = await asyncpg.connect(admin_dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    yield pg.with_database(admin_dsn, name)
    await pg.drop(admin_dsn, name)


async def columns(conn: Any) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'outbox_messages'"
    )
    return {row["column_name"]: row["data_type"] for row in rows}


async def test_migrate_creates_the_contracted_schema(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        applied = await migrate(conn)
        assert applied == [m.name for m in discover()]
        cols = await columns(conn)
        assert {
            "outbox_message_id": "uuid",
            "event_type": "text",
            "payload": "jsonb",
            "status": "text",
            "attempt_count": "integer",
            "next_attempt_at": "timestamp with time zone",
            "processing_started_at": "timestamp with time zone",
            "lease_expires_at": "timestamp with time zone",
            "processed_at": "timestamp with time zone",
            "last_error": "text",
            "created_at": "timestamp with time zone",
        }.items() <= cols.items()
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status) "
                "VALUES (gen_random_uuid(), 'X', '{}', 'Done')"
            )
    finally:
        await conn.close()


async def test_migrate_twice_applies_nothing_the_second_time(empty_db: str) -> None:
    conn = await asyncpg.connect(empty_db)
    try:
        assert await migrate(conn)
        assert await migrate(conn) == []
        recorded = await conn.fetchval("SELECT count(*) FROM outbox_migrations")
        assert recorded == len(discover())
    finally:
        await conn.close()


async def test_concurrent_migrators_apply_each_migration_once(empty_db: str) -> None:
    conns = [await asyncpg.connect(empty_db) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in conns))
        assert sorted(len(r) for r in results) == [0, 0, 0, len(discover())]
        assert await conns[0].fetchval("SELECT count(*) FROM outbox_migrations") == len(discover())
    finally:
        for conn in conns:
            await conn.close()


async def test_an_edited_migration_is_refused(empty_db: str, tmp_path: Path) -> None:
    for source in MIGRATIONS_DIR.glob("*.sql"):
        (tmp_path / source.name).write_text(source.read_text())
    conn = await asyncpg.connect(empty_db)
    try:
        await migrate(conn, tmp_path)
        first = sorted(tmp_path.glob("*.sql"))[0]
        first.write_text(first.read_text() + "\n-- edited\n")
        with pytest.raises(MigrationError, match=f"{first.name} was edited after it was applied"):
            await migrate(conn, tmp_path)
    finally:
        await conn.close()


async def test_lease_uses_the_partial_index(db: Any) -> None:
    await db.execute(
        "INSERT INTO outbox_messages "
        "(outbox_message_id, event_type, payload, status, processed_at) "
        "SELECT gen_random_uuid(), 'X', '{}', 'Processed', now() FROM generate_series(1, 20000)"
    )
    await db.execute(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "SELECT gen_random_uuid(), 'X', '{}' FROM generate_series(1, 50)"
    )
    await db.execute("ANALYZE outbox_messages")
    plan = await db.fetchval(
        "EXPLAIN (FORMAT JSON) " + QUERIES["lease_batch"], 30.0, True, 1024, 10
    )
    assert "outbox_messages_due_idx" in str(plan)
    # No scan of the messages table (the breakers' few rows are read whole, as they should be).
    assert not re.search(r'"Seq Scan",[^}]*"Relation Name": "outbox_messages"', str(plan))
