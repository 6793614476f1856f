from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outbox.core.errors import MigrationError
from outbox.store import QUERIES, partitions
from outbox.store.migrate import MIGRATIONS_DIR, Migration, discover, migrate
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


async def test_a_migration_longer_than_the_statement_timeout_is_not_cut(
    empty_db: str, tmp_path: Path
) -> None:
    """A migration may rewrite or index millions of rows: the 30 s that bounds the relay's own
    statements (here 0.5 s) does not apply to it; its waits for locks have their own bound."""
    for source in MIGRATIONS_DIR.glob("*.sql"):
        (tmp_path / source.name).write_text(source.read_text())
    (tmp_path / "9001_slow.sql").write_text(
        "SELECT pg_sleep(1.5);\n"
        "CREATE TABLE slow_rows (id int);\n"
        "INSERT INTO slow_rows VALUES (1);\n"
        "CREATE FUNCTION slow_id(int) RETURNS int IMMUTABLE LANGUAGE plpgsql\n"
        "AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN $1; END $$;\n"
    )
    (tmp_path / "9002_slow_index.sql").write_text(
        "-- outbox: no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS slow_ix ON slow_rows ((slow_id(id)));\n"
    )
    conn = await asyncpg.connect(empty_db, command_timeout=0.5)
    try:
        await conn.execute("SELECT 1")  # the first statement needs no table
        applied = await migrate(conn, tmp_path)
        assert applied[-2:] == ["9001_slow.sql", "9002_slow_index.sql"]
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


async def test_a_new_installation_appends_attempts_to_a_range_without_a_summary(db: Any) -> None:
    # 0024: an attempt appended to a BRIN range without a summary writes nothing to the index;
    # the range is summarised once (by autovacuum when full; here by hand) and then holds it.
    await db.execute(
        "INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, started_at,"
        " finished_at, duration_ms, outcome, applied)"
        " VALUES (gen_random_uuid(), 1, gen_random_uuid(), now(), now(), 1, 'Processed', true)"
    )
    summarised = await db.fetchval(
        "SELECT brin_summarize_range('outbox_attempts_finished_idx'::regclass, 0)"
    )
    assert summarised == 1  # it had none
    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox_attempts WHERE finished_at >= now() - interval '1 minute'"
        )
        == 1
    )


async def test_a_partitioned_layout_converted_before_0026_takes_it_and_0027(
    empty_db: str, tmp_path: Path
) -> None:
    # The upgrade of an installation on the partitioned layout: the index 0026 builds is built on
    # each partition and attached (PostgreSQL builds none concurrently on a partitioned table),
    # and 0027 drops the one it replaces, partitions included.
    before = [m for m in discover() if m.name < "0026"]
    for migration in before:
        (tmp_path / migration.name).write_text(migration.sql, encoding="utf-8")
    conn = await asyncpg.connect(empty_db)
    try:
        await migrate(conn, tmp_path)
        await partitions.convert(conn)
        applied = await migrate(conn)
        assert applied == [m.name for m in discover() if m.name >= "0026"]
        assert await index_state(conn, "outbox_messages_pending_unkeyed_idx") == (True, False)
        assert await index_state(conn, "outbox_messages_due_unkeyed_idx") is None
        leaves = await conn.fetchval(
            "SELECT count(*) FROM pg_partition_tree('outbox_messages') WHERE isleaf"
        )
        attached = await conn.fetchval(
            "SELECT count(*) FROM pg_inherits"
            " WHERE inhparent = 'outbox_messages_pending_unkeyed_idx'::regclass"
        )
        assert leaves >= 4  # today's partitions, those ahead, the default one
        assert attached == leaves
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_class WHERE relname LIKE '%due_unkeyed%'"
        )
        assert left == 0
    finally:
        await conn.close()


def with_extra(tmp_path: Path, name: str, sql: str) -> Path:
    """The package's migrations and one more, ``name``, in a folder of their own."""
    for migration in discover():
        (tmp_path / migration.name).write_text(migration.sql, encoding="utf-8")
    (tmp_path / name).write_text(sql, encoding="utf-8")
    return tmp_path


CONCURRENT_INDEX = (
    "-- outbox: no-transaction\n"
    "-- Built without blocking producers.\n"
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_event_type_idx\n"
    "    ON outbox_messages (event_type);\n"
)


async def index_state(conn: Any, name: str) -> tuple[bool, bool] | None:
    """(valid, unique) of index ``name``, None when there is none."""
    row = await conn.fetchrow(
        "SELECT indisvalid, indisunique FROM pg_index WHERE indexrelid = to_regclass($1)", name
    )
    return None if row is None else (row["indisvalid"], row["indisunique"])


async def test_a_no_transaction_migration_builds_its_index_concurrently_and_is_recorded(
    db: Any, tmp_path: Path
) -> None:
    folder = with_extra(tmp_path, "9001_event_type_index.sql", CONCURRENT_INDEX)
    assert await migrate(db, folder) == ["9001_event_type_index.sql"]
    assert await index_state(db, "outbox_messages_event_type_idx") == (True, False)
    recorded = await db.fetchval(
        "SELECT checksum FROM outbox_migrations WHERE name = '9001_event_type_index.sql'"
    )
    assert recorded == Migration("9001_event_type_index.sql", CONCURRENT_INDEX).checksum
    assert await migrate(db, folder) == []


async def test_an_invalid_index_left_by_a_failed_concurrent_build_is_built_again(
    db: Any, tmp_path: Path
) -> None:
    # A build that failed half-way (here: duplicates under UNIQUE) leaves the index INVALID:
    # IF NOT EXISTS alone would take it for done.
    await db.execute(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "SELECT gen_random_uuid(), 'Same', '{}' FROM generate_series(1, 2)"
    )
    with pytest.raises(asyncpg.UniqueViolationError):
        await db.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY outbox_messages_event_type_idx "
            "ON outbox_messages (event_type)"
        )
    assert await index_state(db, "outbox_messages_event_type_idx") == (False, True)
    folder = with_extra(tmp_path, "9001_event_type_index.sql", CONCURRENT_INDEX)
    assert await migrate(db, folder) == ["9001_event_type_index.sql"]
    assert await index_state(db, "outbox_messages_event_type_idx") == (True, False)


def test_a_no_transaction_migration_holds_one_statement_that_can_run_again() -> None:
    two = Migration("x.sql", CONCURRENT_INDEX + "DROP INDEX outbox_messages_due_idx;\n")
    with pytest.raises(MigrationError, match="more than one statement"):
        two.concurrent_index()
    once = Migration("y.sql", CONCURRENT_INDEX.replace(" IF NOT EXISTS", ""))
    with pytest.raises(MigrationError, match="without IF NOT EXISTS"):
        once.concurrent_index()
    assert Migration("z.sql", CONCURRENT_INDEX).concurrent_index() == (
        "outbox_messages_event_type_idx"
    )
    assert not Migration("z.sql", CONCURRENT_INDEX).transactional
    shipped = [migration for migration in discover() if not migration.transactional]
    assert [m.name for m in shipped][:3] == [
        "0013_due_unkeyed_index.sql",
        "0014_failed_in_requeue_order.sql",
        "0015_drop_failed_created_index.sql",
    ]
    for migration in shipped:  # each one statement, and one that finds its work done if run again
        migration.concurrent_index()
        assert re.search(r"CONCURRENTLY IF (NOT )?EXISTS", migration.sql), migration.name


async def test_migrate_gives_up_after_max_lock_wait_naming_what_it_waited_for(
    db: Any, database_url: str, tmp_path: Path
) -> None:
    # A migration that needs a lock a reader of outbox_messages holds.
    folder = with_extra(
        tmp_path, "9001_lock_messages.sql", "LOCK TABLE outbox_messages IN ACCESS EXCLUSIVE MODE;"
    )
    reader = await asyncpg.connect(database_url, server_settings={"application_name": "report"})
    try:
        async with reader.transaction():
            await reader.fetchval("SELECT count(*) FROM outbox_messages")
            with pytest.raises(MigrationError) as raised:
                await migrate(db, folder, max_lock_wait=0)
    finally:
        await reader.close()
    message = str(raised.value)
    assert "9001_lock_messages.sql could not take its locks in 0 s" in message
    assert "'report'" in message
    assert "\n" not in message
    assert await db.fetchval("SELECT count(*) FROM outbox_migrations") == len(discover())
    assert await db.fetchval("SHOW lock_timeout") == "0"  # the session's own setting, put back
    assert await migrate(db, folder) == ["9001_lock_messages.sql"]
