"""``migrate`` beside a long reader: producers are never queued behind it for long.

A migration that needs a strong lock on ``outbox_messages`` waits for every transaction that has
read the table; while it waits, each producer's INSERT waits behind it. ``migrate`` takes its
locks with a short ``lock_timeout`` and, when one is not granted, rolls back (letting the
producers through), says what it waits for, and tries again.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

import outbox
from outbox.store.migrate import LOCK_TIMEOUT_SECONDS, MIGRATIONS_DIR, discover, migrate
from tests.support import pg
from tests.support.processes import Child

# Before 0011, which drops the attempt history's foreign key to outbox_messages and adds triggers
# to it: the first migration since trace_context (0008) that needs a strong lock on the table.
EARLIER = "0010_attempts_one_index.sql"
# A correctness bound, not a speed figure: without the fix an insert waits as long as the read.
SLACK_SECONDS = 3.0
READ_HELD_AT_MOST_SECONDS = 20.0


@pytest.fixture
async def earlier_schema(admin_dsn: str, tmp_path: Path) -> AsyncIterator[str]:
    """A database migrated up to ``EARLIER`` (included), as a user of an older package has it."""
    for migration in discover():
        if migration.name <= EARLIER:
            (tmp_path / migration.name).write_text(migration.sql, encoding="utf-8")
    name = pg.unique_name("outbox_mig")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    url = pg.with_database(admin_dsn, name)
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn, tmp_path)
        await conn.execute(
            "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
            "SELECT gen_random_uuid(), 'OrderCompleted', '{}' FROM generate_series(1, 100)"
        )
    finally:
        await conn.close()
    yield url
    await pg.drop(admin_dsn, name)


async def produce(url: str, stop: asyncio.Event, durations: list[float]) -> None:
    """Enqueue one message per transaction until ``stop``, timing each business transaction."""
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            started = time.monotonic()
            async with conn.transaction():
                await outbox.enqueue(conn, "OrderCompleted", {"n": len(durations)})
            durations.append(time.monotonic() - started)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_migrate_beside_a_long_reader_never_holds_producers_past_its_lock_timeout(
    earlier_schema: str,
) -> None:
    reader = await asyncpg.connect(earlier_schema, server_settings={"application_name": "report"})
    stop = asyncio.Event()
    durations: list[float] = []
    producer = asyncio.create_task(produce(earlier_schema, stop, durations))
    migrator: Child | None = None
    try:
        read = reader.transaction()
        await read.start()
        await reader.fetchval("SELECT count(*) FROM outbox_messages")
        migrator = await Child.start(
            "outbox", "migrate", env={"OUTBOX_DATABASE_URL": earlier_schema}
        )
        # The read stays open until migrate has twice found its lock taken (or, without the
        # fix, until the read has outlasted any bound a producer could be held to).
        held_until = time.monotonic() + READ_HELD_AT_MOST_SECONDS
        while time.monotonic() < held_until and waits(migrator) < 2:
            await asyncio.sleep(0.1)
        during_read = len(durations)
        await read.rollback()
        assert await asyncio.wait_for(migrator.process.wait(), 120) == 0, migrator.output
        await migrator.stop()
        stop.set()
        await producer
    finally:
        stop.set()
        if migrator is not None:
            await migrator.kill()
        await reader.close()
        if not producer.done():
            producer.cancel()
    assert max(durations) < LOCK_TIMEOUT_SECONDS + SLACK_SECONDS, (max(durations), migrator.output)
    assert during_read >= 5, migrator.output  # producers went on while migrate waited
    wait_line = next(line for line in migrator.lines if "waits for" in line)
    assert "0011_attempts_without_foreign_key.sql" in wait_line
    assert "'report'" in wait_line  # the reader, by its application_name
    applied = json.loads(migrator.lines[-1])["applied"]
    assert applied == [m.name for m in discover(MIGRATIONS_DIR) if m.name > EARLIER]


def waits(migrator: Child) -> int:
    return sum("waits for" in line for line in migrator.lines)
