"""The partitioned layout (``migrate --partitioned``): the conversion with data and with producers
writing, partitions ahead and the default partition, retention by partition that keeps every live
row, caller-given ids, and the way back (docs/partitioning.md)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import outbox
from outbox import operations
from outbox.core.errors import DuplicateMessageError
from outbox.operations.requests import RequeueFilter
from outbox.store import partitions
from outbox.store.migrate import discover, migrate
from outbox.store.partitions import maintenance, naming
from tests.support.outbox_helpers import open_relay, run_cli, seed, statuses
from tests.support.receiver import Receiver


@pytest.fixture
async def partitioned(db: Any, outbox_layout: str) -> Any:
    """This test's database on the partitioned layout (converted here on a plain run)."""
    if outbox_layout == "plain":
        await partitions.convert(db)
    assert await partitions.is_partitioned(db)
    return db


async def insert_at(
    db: Any, created_at: datetime, status: str = "Pending", **columns: Any
) -> uuid.UUID:
    """A row written as if at ``created_at`` (a day of a simulated past)."""
    message_id = uuid.uuid4()
    names = ["outbox_message_id", "event_type", "payload", "status", "created_at", *columns]
    values = [message_id, "OrderCompleted", '{"orderId": 1}', status, created_at]
    values += list(columns.values())
    marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await db.execute(f"INSERT INTO outbox_messages ({', '.join(names)}) VALUES ({marks})", *values)
    return message_id


async def purge(db: Any, retention_days: int) -> operations.PurgeReport:
    return await operations.purge(
        db, retention_days=retention_days, failed_retention_days=None, batch_size=100
    )


async def partition_names(db: Any, table: str = "outbox_messages") -> list[str]:
    return [p.name for p in await partitions.partitions_of(db, table)]


async def test_converting_a_plain_table_keeps_every_row_and_delivers_the_pending_ones(
    db: Any, outbox_layout: str, make_settings: Any, receiver: Receiver
) -> None:
    if outbox_layout == "partitioned":
        await partitions.convert_back(db)
    pending = await seed(db, 20)
    async with db.transaction():
        done = await outbox.enqueue(db, "OrderCompleted", {"n": 1})
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processed', processed_at = now() "
        "WHERE outbox_message_id = $1",
        done,
    )
    report = await partitions.convert(db)
    assert report["converted"]
    assert report["legacy_attached"]
    names = await partition_names(db)
    assert names[0] == "outbox_messages_legacy"
    assert names[-1] == "outbox_messages_default"
    assert len(names) >= 2 + partitions.AHEAD["daily"]
    assert await statuses(db) == {"Pending": 20, "Processed": 1}
    # Every id from before the conversion is still refused when given again.
    with pytest.raises(DuplicateMessageError):
        async with db.transaction():
            await outbox.enqueue(db, "OrderCompleted", {"n": 2}, message_id=pending[0])
    # New messages go to the partition of their time; the relay delivers old and new alike.
    fresh = await seed(db, 5)
    where = await db.fetchval(
        "SELECT tableoid::regclass::text FROM outbox_messages WHERE outbox_message_id = $1",
        fresh[0],
    )
    assert where.startswith("outbox_messages_p")
    async with open_relay(make_settings()) as relay:
        summary = await relay.drain()
    assert summary.processed == 25
    assert {r.webhook_id for r in receiver.to("/orders")} == {str(i) for i in pending + fresh}
    assert await statuses(db) == {"Processed": 26}
    # Converting again changes nothing.
    again = await partitions.convert(db)
    assert not again["converted"]
    assert again["partitions_created"] == []


async def test_a_caller_given_id_is_refused_twice_on_the_partitioned_layout(
    partitioned: Any,
) -> None:
    db = partitioned
    message_id = uuid.uuid4()
    async with db.transaction():
        assert await outbox.enqueue(db, "OrderCompleted", {"n": 1}, message_id=message_id)
    async with db.transaction():
        with pytest.raises(DuplicateMessageError):
            await outbox.enqueue(db, "OrderCompleted", {"n": 2}, message_id=message_id)
        # The caller's transaction is still usable after the refusal.
        other = await outbox.enqueue(db, "OrderCompleted", {"n": 3})
    assert await db.fetchval("SELECT count(*) FROM outbox_messages") == 2
    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox_message_ids WHERE outbox_message_id = ANY ($1::uuid[])",
            [message_id, other],
        )
        == 1
    )  # only the caller-given id is claimed


async def test_two_transactions_giving_one_id_at_once_write_it_once(
    partitioned: Any, database_url: str
) -> None:
    message_id = uuid.uuid4()
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        tx = first.transaction()
        await tx.start()
        await outbox.enqueue(first, "OrderCompleted", {"n": 1}, message_id=message_id)

        async def again() -> BaseException | None:
            try:
                async with second.transaction():
                    await outbox.enqueue(second, "OrderCompleted", {"n": 2}, message_id=message_id)
            except DuplicateMessageError as exc:
                return exc
            return None

        waiting = asyncio.create_task(again())
        await asyncio.sleep(0.3)
        assert not waiting.done()  # it waits for the first transaction, as a unique index does
        await tx.commit()
        assert isinstance(await waiting, DuplicateMessageError)
    finally:
        await first.close()
        await second.close()
    assert await partitioned.fetchval("SELECT count(*) FROM outbox_messages") == 1


async def test_a_row_no_partition_covers_waits_in_the_default_partition_until_purge(
    partitioned: Any,
) -> None:
    db = partitioned
    tomorrow = naming.floor(datetime.now(UTC), timedelta(days=1)) + timedelta(days=1)
    name = naming.partition_name("outbox_messages", tomorrow, timedelta(days=1))
    await db.execute(f"DROP TABLE {name}")  # as if the purge had not run for days
    late = await insert_at(db, tomorrow + timedelta(hours=2))
    status = (await operations.backlog_status(db, 900)).as_dict()
    assert status["layout"]["default_partition_unrouted_rows"] == 1
    assert not status["healthy"]
    assert any("default partition" in problem for problem in status["problems"])

    report = await purge(db, retention_days=7)
    assert name in report.partitions["created"]
    where = await db.fetchval(
        "SELECT tableoid::regclass::text FROM outbox_messages WHERE outbox_message_id = $1", late
    )
    assert where == name
    status = (await operations.backlog_status(db, 900)).as_dict()
    assert status["layout"]["default_partition_rows"] == 0
    assert status["healthy"]


async def test_the_conversions_first_attempts_partition_has_no_first_range_summary(
    partitioned: Any,
) -> None:
    # The partition the conversion itself makes (not outbox_make_partition) is met as 0025's.
    db = partitioned
    bound = await db.fetchval("SELECT legacy_bound FROM outbox_partitioning")
    [first] = [p for p in await partitions.partitions_of(db, "outbox_attempts") if p.lower == bound]
    assert first.lower is not None
    assert await first_range_unsummarised(db, first.name, first.lower)


async def test_an_attempts_partition_made_ahead_appends_to_a_range_without_a_summary(
    partitioned: Any,
) -> None:
    # 0025: an attempt appended to a BRIN range without a summary writes nothing to the index;
    # the range is summarised once (by autovacuum when full; here by hand) and then holds it.
    db = partitioned
    step = timedelta(days=1)
    later = naming.floor(datetime.now(UTC), step) + 10 * step  # past those made ahead
    name = naming.partition_name("outbox_attempts", later, step)
    assert name in await partitions.ensure_partitions(db, later, later + step)
    assert await first_range_unsummarised(db, name, later + timedelta(hours=1))


async def first_range_unsummarised(db: Any, partition: str, at: datetime) -> bool:
    """Whether the BRIN index of attempts partition ``partition`` had no summary of its first
    range after an attempt finished ``at`` was appended there (summarising it by hand finds one
    range to do)."""
    added = await db.fetchval(
        "INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, started_at,"
        " finished_at, duration_ms, outcome, applied, recorded_at)"
        " VALUES (gen_random_uuid(), 1, gen_random_uuid(), $1, $1, 1, 'Processed', true, $1)"
        " RETURNING tableoid::regclass::text",
        at,
    )
    assert added == partition
    index = await db.fetchval(
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i"
        " JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS a ON a.oid = c.relam"
        " WHERE i.indrelid = to_regclass($1) AND a.amname = 'brin'",
        partition,
    )
    assert index is not None
    return bool(await db.fetchval("SELECT brin_summarize_range($1::regclass, 0)", index) == 1)


async def past_days(db: Any, days: int) -> datetime:
    """Partitions for the ``days`` days before today; returns the first day's start."""
    today = naming.floor(datetime.now(UTC), timedelta(days=1))
    first = today - timedelta(days=days)
    await partitions.ensure_partitions(db, first, today)
    return first


async def test_retention_drops_old_partitions_and_keeps_every_live_row(
    partitioned: Any, make_settings: Any, receiver: Receiver
) -> None:
    db = partitioned
    first = await past_days(db, 4)
    old = first + timedelta(hours=1)
    done = [
        await insert_at(db, old, "Processed", processed_at=old + timedelta(minutes=1))
        for _ in range(50)
    ]
    late_done = await insert_at(db, old, "Processed", processed_at=datetime.now(UTC))
    waiting = await insert_at(db, old, "Pending")
    failed = await insert_at(db, old, "Failed", last_error="HTTP 500", attempt_count=5)
    for message_id in (*done[:3], failed):
        await db.execute(
            "INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, "
            "started_at, finished_at, duration_ms, outcome, applied, recorded_at) "
            "VALUES ($1, 1, gen_random_uuid(), $2, $2, 5, 'Failed', true, $2)",
            message_id,
            old,
        )
    # Two of them with ids their producers gave, claimed as the producer's insert claims them.
    for message_id in (done[0], waiting):
        await db.execute(
            "INSERT INTO outbox_message_ids (outbox_message_id, created_at) VALUES ($1, $2)",
            message_id,
            old,
        )
    recent = await seed(db, 3)
    before = await partition_names(db)
    oldest = naming.partition_name("outbox_messages", first, timedelta(days=1))
    assert oldest in before

    report = await purge(db, retention_days=2)
    assert report.layout == "partitioned"
    dropped = report.partitions["dropped"]
    assert oldest in dropped
    assert naming.partition_name("outbox_attempts", first, timedelta(days=1)) in dropped
    assert report.partitions["rows_carried"] == 3  # late_done, waiting, failed
    # The claim of the id whose message is gone is released; the carried one's is kept.
    assert report.partitions["ids_released"] == 1
    claimed = await db.fetch("SELECT outbox_message_id FROM outbox_message_ids")
    assert [r["outbox_message_id"] for r in claimed] == [waiting]
    after = await partition_names(db)
    assert oldest not in after
    remaining = {
        r["outbox_message_id"]: r["status"]
        for r in await db.fetch("SELECT outbox_message_id, status FROM outbox_messages")
    }
    assert not set(done) & set(remaining)
    assert remaining[late_done] == "Processed"
    assert remaining[waiting] == "Pending"
    assert remaining[failed] == "Failed"
    assert set(recent) <= set(remaining)
    # The Failed message's history went with it to the default partition.
    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox_attempts WHERE outbox_message_id = $1", failed
        )
        == 1
    )
    assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 1

    # The live rows are delivered and requeued from where they were carried.
    async with open_relay(make_settings()) as relay:
        assert (await relay.drain()).processed == 4  # waiting + recent
        requeued = await operations.requeue(db, RequeueFilter(message_ids=(failed,)), dry_run=False)
        assert requeued.requeued == 1
        assert (await relay.drain()).processed == 1
    ids = {r.webhook_id for r in receiver.to("/orders")}
    assert {str(waiting), str(failed)} <= ids
    status = (await operations.backlog_status(db, 900)).as_dict()
    assert status["layout"]["default_partition_rows"] == 3
    assert status["layout"]["default_partition_unrouted_rows"] == 0
    assert status["healthy"]


async def test_a_partition_past_retention_with_many_live_rows_is_kept_whole(
    partitioned: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = partitioned
    monkeypatch.setattr(maintenance, "CARRY_LIMIT", 1)
    first = await past_days(db, 4)
    live = [await insert_at(db, first + timedelta(hours=1)) for _ in range(2)]
    report = await purge(db, retention_days=2)
    oldest = naming.partition_name("outbox_messages", first, timedelta(days=1))
    assert {"name": oldest, "live_rows_over": 1} in report.partitions["kept"]
    assert oldest in await partition_names(db)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox_messages WHERE outbox_message_id = ANY ($1::uuid[])", live
        )
        == 2
    )
    described = await partitions.describe(db)
    assert described["oldest_partition"]["name"] == oldest
    assert described["oldest_partition"]["live_rows"] == 2


async def processed_at_indexes(db: Any) -> set[tuple[str, str]]:
    """(table, index) of every index on processed_at alone over the outbox's messages."""
    rows = await db.fetch(
        "SELECT tablename, indexname FROM pg_indexes "
        "WHERE tablename LIKE 'outbox_messages%' AND indexdef LIKE '%(processed_at)%'"
    )
    return {(r["tablename"], r["indexname"]) for r in rows}


async def test_the_conversion_and_back_with_a_producer_writing_throughout(
    db: Any, database_url: str, outbox_layout: str
) -> None:
    if outbox_layout == "partitioned":
        await partitions.convert_back(db)
    await seed(db, 200)
    written: list[uuid.UUID] = []
    errors: list[BaseException] = []
    producing = True

    async def produce() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            while producing:
                try:
                    async with conn.transaction():
                        written.append(await outbox.enqueue(conn, "OrderCompleted", {"n": 1}))
                except Exception as exc:  # noqa: BLE001 - any failure is what the test looks for
                    errors.append(exc)
                await asyncio.sleep(0.002)
        finally:
            await conn.close()

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(0.2)
        forth = await partitions.convert(db)
        at_switch = len(written)
        partitioned_indexes = await processed_at_indexes(db)
        await asyncio.sleep(0.2)
        back = await partitions.convert_back(db, batch_size=50)
        await asyncio.sleep(0.2)
    finally:
        producing = False
        await producer
    assert forth["converted"]
    assert back["converted"]
    # The partitioned layout's drop of a partition reads processed_at under its lock: the index
    # the plain table lacks (migration 0020) is made on the parent and every partition, the one
    # that was the plain table included, and left out again on the way back.
    assert ("outbox_messages", "outbox_messages_processed_idx") in partitioned_indexes
    assert {table for table, _ in partitioned_indexes} >= {
        "outbox_messages",
        "outbox_messages_default",
        "outbox_messages_legacy",
    }
    assert await processed_at_indexes(db) == set()
    assert errors == []
    assert len(written) > at_switch > 0
    assert not await partitions.is_partitioned(db)
    rows = await db.fetch("SELECT outbox_message_id FROM outbox_messages")
    ids = [r["outbox_message_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 200 + len(written)
    assert set(written) <= set(ids)
    # The plain table's own statement again: a given id refused by its unique index.
    with pytest.raises(DuplicateMessageError):
        async with db.transaction():
            await outbox.enqueue(db, "OrderCompleted", {"n": 2}, message_id=written[0])
    assert await db.fetchval("SELECT to_regclass('outbox_message_ids')") is None


async def test_the_switch_waits_for_a_long_reader_without_holding_producers_behind_it(
    db: Any, database_url: str, outbox_layout: str
) -> None:
    """The lock rule of the migrations: a switch that cannot take its locks rolls back within the
    lock timeout and tries again, so producers are not queued behind it meanwhile."""
    if outbox_layout == "partitioned":
        await partitions.convert_back(db)
    reader = await asyncpg.connect(database_url)
    producer = await asyncpg.connect(database_url)
    try:
        tx = reader.transaction()
        await tx.start()
        await reader.fetchval("SELECT count(*) FROM outbox_messages")  # holds its lock
        converting = asyncio.create_task(partitions.convert(db))
        committed = 0
        started = time.monotonic()
        while time.monotonic() - started < 5:
            async with producer.transaction():
                await outbox.enqueue(producer, "OrderCompleted", {"n": 1})
            committed += 1
            await asyncio.sleep(0.05)
        assert not converting.done()  # still waiting for the reader
        await tx.rollback()
        await converting
    finally:
        await reader.close()
        await producer.close()
    assert committed >= 3  # producers went on between its tries (behind it: none would)
    assert await partitions.is_partitioned(db)
    assert await db.fetchval("SELECT count(*) FROM outbox_messages") == committed


async def test_cli_migrate_partitioned_and_status(database_url: str, outbox_layout: str) -> None:
    env = {"OUTBOX_DATABASE_URL": database_url}
    result = await run_cli("migrate", "--partitioned", "--partition-interval", "hourly", env=env)
    if outbox_layout == "partitioned":  # already daily: the interval is not changed by migrate
        assert result.returncode != 0
        assert "already partitioned daily" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert '"partition_interval": "hourly"' in result.stdout
    status = await run_cli("status", env=env)
    assert '"layout": "partitioned"' in status.stdout
    assert '"partition_interval": "hourly"' in status.stdout
    bad = await run_cli("migrate", "--partition-interval", "hourly", env=env)
    assert bad.returncode == 2
    assert "--partition-interval applies to migrate --partitioned only" in bad.stderr


# A later migration's index, built and then dropped on the partitioned layout, where PostgreSQL
# builds none CONCURRENTLY on the partitioned table itself (docs/internals.md, "Writing a
# migration").
EVENT_TYPE_INDEX = "outbox_messages_event_type_idx"
BUILD_INDEX = (
    "-- outbox: no-transaction\n"
    f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {EVENT_TYPE_INDEX}\n"
    "    ON outbox_messages (event_type) WHERE status = 'Pending';\n"
)
DROP_INDEX = f"-- outbox: no-transaction\nDROP INDEX CONCURRENTLY IF EXISTS {EVENT_TYPE_INDEX};\n"


def migrations_with(folder: Path, extra: dict[str, str]) -> Path:
    """The package's migrations and ``extra`` (name: text), in ``folder``."""
    for migration in discover():
        (folder / migration.name).write_text(migration.sql, encoding="utf-8")
    for name, sql in extra.items():
        (folder / name).write_text(sql, encoding="utf-8")
    return folder


async def attached(db: Any, index: str) -> dict[str, tuple[str, bool]]:
    """Each partition with an index attached to the partitioned ``index``: its name, and whether
    it is valid."""
    rows = await db.fetch(
        "SELECT c.relname, x.indexrelid::regclass::text AS name, x.indisvalid"
        " FROM pg_inherits AS h"
        " JOIN pg_index AS x ON x.indexrelid = h.inhrelid JOIN pg_class AS c ON c.oid = x.indrelid"
        " WHERE h.inhparent = to_regclass($1)",
        index,
    )
    return {row["relname"]: (row["name"], row["indisvalid"]) for row in rows}


async def leaves(db: Any, table: str) -> set[str]:
    rows = await db.fetch(
        "SELECT relid::regclass::text FROM pg_partition_tree($1::regclass) WHERE isleaf", table
    )
    return {row[0] for row in rows}


async def index_valid(db: Any, index: str) -> bool | None:
    valid: bool | None = await db.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", index
    )
    return valid


async def test_a_later_index_migration_is_built_on_every_partition(
    partitioned: Any, tmp_path: Path
) -> None:
    db = partitioned
    folder = migrations_with(tmp_path, {"9001_event_type.sql": BUILD_INDEX})
    assert await migrate(db, folder) == ["9001_event_type.sql"]
    assert await index_valid(db, EVENT_TYPE_INDEX) is True
    on = await attached(db, EVENT_TYPE_INDEX)
    assert set(on) == await leaves(db, "outbox_messages")
    # Each built concurrently on its partition, named after it.
    assert on == {partition: (f"{partition}_event_type_idx", True) for partition in on}
    # A partition made from now on has its own, from PostgreSQL.
    step = timedelta(days=1)
    later = naming.floor(datetime.now(UTC), step) + 10 * step
    made = naming.partition_name("outbox_messages", later, step)
    assert made in await partitions.ensure_partitions(db, later, later + step)
    assert (await attached(db, EVENT_TYPE_INDEX))[made][1] is True
    assert await migrate(db, folder) == []
    # The way back to the plain table keeps it, as every index of the table.
    await partitions.convert_back(db)
    assert not await partitions.is_partitioned(db)
    assert await index_valid(db, EVENT_TYPE_INDEX) is True


async def test_a_partitions_index_left_invalid_by_a_failed_build_is_built_again(
    partitioned: Any, tmp_path: Path
) -> None:
    db = partitioned
    row = await insert_at(db, datetime.now(UTC))
    partition = await db.fetchval(
        "SELECT tableoid::regclass::text FROM outbox_messages WHERE outbox_message_id = $1", row
    )
    with pytest.raises(asyncpg.DivisionByZeroError):  # a build that failed midway: INVALID
        await db.execute(
            f"CREATE INDEX CONCURRENTLY {partition}_event_type_idx"
            f" ON {partition} ((1 / (attempt_count - attempt_count)))"
        )
    assert await index_valid(db, f"{partition}_event_type_idx") is False
    folder = migrations_with(tmp_path, {"9001_event_type.sql": BUILD_INDEX})
    assert await migrate(db, folder) == ["9001_event_type.sql"]
    assert (await attached(db, EVENT_TYPE_INDEX))[partition] == (
        f"{partition}_event_type_idx",
        True,
    )
    assert await index_valid(db, EVENT_TYPE_INDEX) is True


async def test_a_later_migration_drops_an_index_of_the_partitioned_table(
    partitioned: Any, tmp_path: Path
) -> None:
    db = partitioned
    extra = {"9001_event_type.sql": BUILD_INDEX, "9002_no_event_type.sql": DROP_INDEX}
    folder = migrations_with(tmp_path, extra)
    assert await migrate(db, folder) == list(extra)
    assert await index_valid(db, EVENT_TYPE_INDEX) is None
    left = await db.fetchval(
        "SELECT count(*) FROM pg_class WHERE relkind IN ('i', 'I') AND relname LIKE $1",
        "%event_type_idx",
    )
    assert left == 0
