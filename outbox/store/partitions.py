"""The partitioned layout of the outbox (``python -m outbox migrate --partitioned``), its
retention by partition, and the way back (``migrate --plain``).

``outbox_messages`` is range-partitioned by ``created_at``, ``outbox_attempts`` by
``recorded_at``, one partition per UTC day (or hour), with the same columns, statuses, indexes and
names as the plain tables: producers, the relay, ``show``, ``status``, ``requeue`` and the console
run the same statements on either layout. Each table has a default partition, a safety net for a
row no partition covers (``status`` reports it); ``purge`` makes partitions ahead of time, so it
stays empty while the purge runs.

What the layout changes:

- Retention drops partitions instead of deleting rows: a partition whose every row is older than
  the retention is dropped whole, in one short transaction, whatever the number of its rows. Its
  live rows (Pending, Processing, Processed within the retention, Failed within theirs) are not
  lost: when there are at most ``CARRY_LIMIT`` of them they are moved, in the same transaction,
  to the default partition (their ``created_at`` is kept, so no partition covers them any more),
  where later purges delete them row by row once they are past retention; a partition with more
  of them is kept until it has few enough, and ``status`` shows it.
- A primary key of a partitioned table must hold its partition key: ``(outbox_message_id,
  created_at)``. A caller-given id (``enqueue(message_id=…)``) is claimed in
  ``outbox_message_ids`` (one row per such id, dropped with its message), so a second message
  with the id still raises DuplicateMessageError, under every isolation level. An id the producer
  generated (a random UUID) is not recorded there, as on the plain table it is not looked up.
- Every statement that finds a message by its id alone looks it up in each partition's index.

The conversion from the plain table keeps every row where it is: the plain table becomes the
layout's first partition (``outbox_messages_legacy``, every time before the conversion), after a
unique index it needs has been built without blocking anyone. The switch itself is one short
transaction (renames, two empty partitions); until the legacy partition is attached after it
(checked by a constraint validated without blocking), the messages enqueued before the
conversion are not leased. It is resumable: run it again after any failure.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from outbox.core.errors import MigrationError
from outbox.store import migrate as migrations
from outbox.store import postgres as store

logger = logging.getLogger("outbox.partitions")

MESSAGES = "outbox_messages"
ATTEMPTS = "outbox_attempts"
INTERVALS = {"daily": timedelta(days=1), "hourly": timedelta(hours=1)}
DEFAULT_INTERVAL = "daily"
# Partitions made ahead of the present: three days of daily ones, two days of hourly ones. The
# daily purge makes the next ones; a purge that did not run for longer than that leaves new rows
# in the default partition (reported), never refused.
AHEAD = {"daily": 3, "hourly": 48}
# The live rows a partition past retention may hold and still be dropped: they are moved to the
# default partition in the transaction that drops it (under its lock, so few).
CARRY_LIMIT = 10_000
# How long a partition's drop waits for its lock on the parent before it gives way and tries again:
# every producer and relay that comes meanwhile waits behind it (docs/partitioning.md).
DROP_LOCK_TIMEOUT_SECONDS = 0.02
# Caller-given ids, and rows moved back to a plain table, per transaction.
BATCH_SIZE = 10_000
# The attempt history of messages still kept that an attempts partition may hold and be dropped.
ATTEMPTS_CARRY_LIMIT = 100_000
_SUFFIX = re.compile(r"^[a-z0-9_]+$")


@dataclass(slots=True)
class Partition:
    name: str
    lower: datetime | None  # None: MINVALUE (the legacy partition)
    upper: datetime | None  # None: the default partition


@dataclass(slots=True)
class PartitionReport:
    """What ``maintain`` did: partitions made and dropped, live rows moved, partitions kept."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rows_carried: int = 0
    kept: list[dict[str, Any]] = field(default_factory=list)
    default_rows_deleted: int = 0
    ids_released: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Reading the layout


async def is_partitioned(conn: store.Connection) -> bool:
    return bool(
        await _fetchval(
            conn, "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass('outbox_messages')"
        )
    )


async def interval_of(conn: store.Connection) -> str:
    if await _fetchval(conn, "SELECT to_regclass('outbox_partitioning') IS NULL"):
        return DEFAULT_INTERVAL
    value = await _fetchval(conn, "SELECT partition_interval FROM outbox_partitioning")
    return str(value or DEFAULT_INTERVAL)


async def partitions_of(conn: store.Connection, table: str) -> list[Partition]:
    """The partitions of ``table``, oldest first, the default partition last."""
    rows = await _fetch(
        conn,
        """
        SELECT c.relname AS name,
               (regexp_match(b.bound, 'FROM \\(''([^'']+)''\\)'))[1]::timestamptz AS lower,
               (regexp_match(b.bound, 'TO \\(''([^'']+)''\\)'))[1]::timestamptz AS upper,
               b.bound = 'DEFAULT' AS is_default
        FROM pg_inherits AS i
        JOIN pg_class AS c ON c.oid = i.inhrelid
        CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
        WHERE i.inhparent = to_regclass($1)
        ORDER BY b.bound = 'DEFAULT', 3 NULLS LAST
        """,
        table,
    )
    return [
        Partition(row["name"], row["lower"], None if row["is_default"] else row["upper"])
        for row in rows
    ]


async def describe(conn: store.Connection) -> dict[str, Any]:
    """The layout for ``status``: its name; on the partitioned one, the partition interval and
    count, the oldest partition with its live rows, and the rows in the default partition
    (``unrouted``: those newer than the oldest partition, which a partition made ahead would
    have taken)."""
    if not await is_partitioned(conn):
        return {"layout": "plain"}
    partitions = await partitions_of(conn, MESSAGES)
    ranged = [p for p in partitions if p.upper is not None]
    oldest = ranged[0] if ranged else None
    described: dict[str, Any] = {
        "layout": "partitioned",
        "partition_interval": await interval_of(conn),
        "partitions": len(ranged),
        "oldest_partition": None,
        "default_partition_rows": 0,
        "default_partition_unrouted_rows": 0,
    }
    if oldest is not None:
        described["oldest_partition"] = {
            "name": oldest.name,
            "from": _iso(oldest.lower),
            "to": _iso(oldest.upper),
            "live_rows": await _fetchval(
                conn,
                f"SELECT count(*) FROM {_ident(oldest.name)} "
                "WHERE status IN ('Pending', 'Processing', 'Failed')",
            ),
        }
    default = next((p for p in partitions if p.upper is None), None)
    if default is not None:
        row = await _fetchrow(
            conn,
            f"SELECT count(*) AS rows, count(*) FILTER (WHERE created_at >= $1) AS unrouted "
            f"FROM {_ident(default.name)}",
            oldest.lower if oldest is not None and oldest.lower is not None else _MIN,
        )
        described["default_partition_rows"] = row["rows"]
        described["default_partition_unrouted_rows"] = row["unrouted"]
    return described


def layout_problems(described: dict[str, Any]) -> list[str]:
    """What ``status`` reports as unhealthy about the layout."""
    unrouted = described.get("default_partition_unrouted_rows") or 0
    if not unrouted:
        return []
    return [
        f"{unrouted} messages are in the default partition: no partition covered their time. "
        "Run `python -m outbox purge` (it makes partitions ahead and moves them into theirs)"
    ]


# ---------------------------------------------------------------------------------------------
# The conversion


async def convert(
    conn: store.Connection,
    *,
    interval: str = DEFAULT_INTERVAL,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> dict[str, Any]:
    """Convert the plain tables to the partitioned layout (or finish a conversion that stopped
    half-way), then make the partitions ahead. On the partitioned layout already, only the
    latter. Run after the numbered migrations (``migrate``), under the migrators' advisory lock.
    """
    async with store.migration_lock(conn):
        return await _convert(conn, interval, max_lock_wait)


async def _convert(conn: store.Connection, interval: str, max_lock_wait: float) -> dict[str, Any]:
    if interval not in INTERVALS:
        raise MigrationError(f"partition interval must be one of {', '.join(INTERVALS)}")
    if await _exists(conn, "outbox_messages_partitioned_old"):
        raise MigrationError(
            "a conversion back to the plain table is under way: finish it with "
            "`python -m outbox migrate --plain` first"
        )
    converted = False
    if not await is_partitioned(conn):
        await _prepare(conn, interval)
        await migrations.retrying(
            conn, "the switch to the partitioned layout", max_lock_wait, _switch
        )
        converted = True
    else:
        current = await interval_of(conn)
        if current != interval:
            raise MigrationError(
                f"the outbox is already partitioned {current}; its interval is not changed by "
                "migrate (convert back with --plain, then again)"
            )
    attached = await _finish_legacy(conn, max_lock_wait)
    created = await ensure_partitions(conn, max_lock_wait=max_lock_wait)
    return {
        "layout": "partitioned",
        "partition_interval": interval,
        "converted": converted,
        "legacy_attached": attached,
        "partitions_created": created,
    }


async def _prepare(conn: store.Connection, interval: str) -> None:
    """Everything that needs no strong lock: the new parents (empty, used by no one yet) and the
    unique indexes and checks the plain tables need to become their partitions."""
    await _execute(conn, "DROP TABLE IF EXISTS outbox_messages_next, outbox_attempts_next")
    await _execute(
        conn,
        """
        CREATE TABLE IF NOT EXISTS outbox_partitioning (
            only_row           boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
            partition_interval text        NOT NULL
                CHECK (partition_interval IN ('daily', 'hourly')),
            legacy_bound       timestamptz,
            ids_copied         boolean     NOT NULL DEFAULT false
        )
        """,
    )
    await _execute(conn, "DELETE FROM outbox_partitioning")
    await _fetchval(
        conn, "INSERT INTO outbox_partitioning (partition_interval) VALUES ($1)", interval
    )
    await _execute(
        conn,
        """
        CREATE TABLE IF NOT EXISTS outbox_message_ids (
            outbox_message_id uuid        PRIMARY KEY,
            created_at        timestamptz NOT NULL DEFAULT now()
        )
        """,
    )
    await _execute(
        conn,
        "CREATE INDEX IF NOT EXISTS outbox_message_ids_created_idx "
        "ON outbox_message_ids USING brin (created_at)",
    )
    await _execute(conn, "CREATE SEQUENCE IF NOT EXISTS outbox_attempts_id_seq AS bigint")
    # The partitioned layout's purge finds live rows by processed_at under a partition's lock;
    # the plain table has no such index since migration 0020: built first, without blocking, so
    # that the parent gets it below and the plain table enters as a partition with it.
    await store.build_index_concurrently(
        conn,
        PROCESSED_INDEX,
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {PROCESSED_INDEX} {_ON_PROCESSED}",
    )
    for table, key in ((MESSAGES, "created_at"), (ATTEMPTS, "recorded_at")):
        await _execute(
            conn,
            f"CREATE TABLE {table}_next (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            f"INCLUDING COMMENTS) PARTITION BY RANGE ({key})",
        )
        columns = "outbox_message_id, " + (
            "created_at" if table == MESSAGES else "attempt_id, recorded_at"
        )
        await _execute(
            conn,
            f"ALTER TABLE {table}_next ADD CONSTRAINT {table}_pkey_next PRIMARY KEY ({columns})",
        )
        for definition in await _index_definitions(conn, table):
            await _execute(conn, _retarget(definition, table, f"{table}_next", "_next"))
        await _execute(
            conn,
            f"CREATE TABLE {table}_default PARTITION OF {table}_next DEFAULT" + _storage(table),
        )
    await _execute(
        conn,
        "ALTER TABLE outbox_attempts_next ALTER COLUMN attempt_id "
        "SET DEFAULT nextval('outbox_attempts_id_seq')",
    )
    await _execute(
        conn,
        "ALTER SEQUENCE outbox_attempts_id_seq OWNED BY outbox_attempts_next.attempt_id",
    )
    for trigger in _MESSAGE_TRIGGERS:
        await _execute(conn, trigger.format(table="outbox_messages_next"))
    # The plain tables' keys as the parents' keys (the partition key in them), built without
    # blocking; and the ordering check of migration 0002 validated (a partition's checks must be).
    await store.build_index_concurrently(
        conn,
        "outbox_messages_legacy_key",
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_legacy_key "
        "ON outbox_messages (outbox_message_id, created_at)",
    )
    await store.build_index_concurrently(
        conn,
        "outbox_attempts_legacy_key",
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_attempts_legacy_key "
        "ON outbox_attempts (outbox_message_id, attempt_id, recorded_at)",
    )
    await _execute(
        conn, "ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_ordering_check"
    )


async def _switch(conn: store.Connection) -> None:
    """One short transaction: the plain tables step aside (renamed ``…_legacy``), the new
    parents take their names, with a first partition from this moment on. Producers and relays
    wait for it at most the lock timeout, then use the new tables."""
    async with conn.transaction():
        await _lock_timeout(conn)
        await _execute(conn, "LOCK TABLE outbox_messages, outbox_attempts IN ACCESS EXCLUSIVE MODE")
        # Every row of the plain tables was written before this moment (their writers have
        # committed): from it on, the partitions take the new ones.
        bound: datetime = await _fetchval(conn, "SELECT clock_timestamp()")
        step = INTERVALS[await interval_of(conn)]
        first_upper = _floor(bound, step) + step
        await _fetchval(
            conn,
            # Attempt ids go on rising: from the identity's sequence (migration 0003), or from
            # this one's own value (a table converted back, then again).
            "SELECT setval('outbox_attempts_id_seq', GREATEST("
            "(SELECT last_value FROM outbox_attempts_id_seq), COALESCE(pg_sequence_last_value("
            "pg_get_serial_sequence('outbox_attempts', 'attempt_id')::regclass), 0)) + 1, false)",
        )
        for table in (MESSAGES, ATTEMPTS):
            await _execute(
                conn,
                f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, "
                f"ADD CONSTRAINT {table}_legacy_pkey PRIMARY KEY USING INDEX {table}_legacy_key",
            )
            for name in await _index_names(conn, table):
                if not name.startswith(f"{table}_legacy"):
                    await _execute(
                        conn, f"ALTER INDEX {name} RENAME TO {_legacy_name(name, table)}"
                    )
            if table == ATTEMPTS:
                await _execute(
                    conn, "ALTER TABLE outbox_attempts ALTER attempt_id DROP IDENTITY IF EXISTS"
                )
            await _take_over(conn, table, f"{table}_legacy")
            await _execute(
                conn,
                f"CREATE TABLE {_partition_name(table, bound, step)} PARTITION OF {table} "
                f"FOR VALUES FROM ('{bound.isoformat()}') TO ('{first_upper.isoformat()}')"
                + _storage(table),
            )
        await _execute(conn, _PARTITIONED_INSERT)
        await _fetchval(conn, "UPDATE outbox_partitioning SET legacy_bound = $1", bound)


async def _finish_legacy(conn: store.Connection, max_lock_wait: float) -> bool:
    """Attach the plain tables as the partitions of every time before the conversion, then
    claim their ids in outbox_message_ids. Both idempotent; False when there was nothing left."""
    bound = await _fetchval(conn, "SELECT legacy_bound FROM outbox_partitioning")
    did = False
    for table, key in ((MESSAGES, "created_at"), (ATTEMPTS, "recorded_at")):
        legacy = f"{table}_legacy"
        if not await _exists(conn, legacy) or await _fetchval(
            conn, "SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)", legacy
        ):
            continue
        if not await _fetchval(conn, f"SELECT EXISTS (SELECT 1 FROM {legacy})") and not (
            await _fetchval(
                conn, f"SELECT EXISTS (SELECT 1 FROM {table}_default WHERE {key} < $1)", bound
            )
        ):
            await _execute(conn, f"DROP TABLE {legacy}")  # a new install's: nothing to keep
            did = True
            continue
        # Validated without blocking (no one writes the legacy table any more): the attach
        # then skips its own scan, which would hold the default partition's lock meanwhile.
        await _execute(
            conn,
            f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS {legacy}_bound, "
            f"ADD CONSTRAINT {legacy}_bound CHECK ({key} < '{bound.isoformat()}') NOT VALID",
        )
        await _execute(conn, f"ALTER TABLE {legacy} VALIDATE CONSTRAINT {legacy}_bound")

        async def attach(conn: store.Connection, table: str = table, key: str = key) -> None:
            async with conn.transaction():
                await _lock_timeout(conn)
                # Rows of a transaction that began before the switch and wrote after it went
                # to the default partition: they belong to the legacy one.
                await _execute(
                    conn,
                    f"WITH moved AS (DELETE FROM {table}_default "
                    f"WHERE {key} < '{bound.isoformat()}' RETURNING *) "
                    f"INSERT INTO {table}_legacy SELECT * FROM moved",
                )
                await _execute(
                    conn,
                    f"ALTER TABLE {table} ATTACH PARTITION {table}_legacy "
                    f"FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')",
                )

        await migrations.retrying(conn, f"attaching {legacy}", max_lock_wait, attach)
        did = True
    if bound is not None and not await _fetchval(
        conn, "SELECT ids_copied FROM outbox_partitioning"
    ):
        if await _exists(conn, "outbox_messages_legacy"):
            await _copy_legacy_ids(conn)
        await _execute(conn, "UPDATE outbox_partitioning SET ids_copied = true")
        did = True
    return did


async def _copy_legacy_ids(conn: store.Connection) -> None:
    """Every id from before the conversion, claimed in batches (its own transaction each)."""
    last = None
    while True:
        last = await _fetchval(
            conn,
            """
            WITH batch AS (
                SELECT outbox_message_id, created_at
                FROM outbox_messages_legacy
                WHERE $1::uuid IS NULL OR outbox_message_id > $1::uuid
                ORDER BY outbox_message_id
                LIMIT $2
            ), claimed AS (
                INSERT INTO outbox_message_ids (outbox_message_id, created_at)
                SELECT outbox_message_id, created_at FROM batch
                ON CONFLICT (outbox_message_id) DO NOTHING
            )
            SELECT max(outbox_message_id::text)::uuid FROM batch
            """,
            last,
            BATCH_SIZE,
        )
        if last is None:
            return


# ---------------------------------------------------------------------------------------------
# Partitions ahead, and retention


async def ensure_partitions(
    conn: store.Connection,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> list[str]:
    """Make the partitions of both tables that cover [``start``, ``end``) (by default from now
    to ``AHEAD`` intervals on), each attached in a transaction of its own that takes no lock a
    producer or a relay waits for (the default partition's only, and briefly: rows it holds in
    the new partition's range move into it). Returns the names made."""
    step = INTERVALS[await interval_of(conn)]
    now = datetime.now(UTC)
    start = start or now
    end = end or now + AHEAD[await interval_of(conn)] * step
    made = []
    for table in (MESSAGES, ATTEMPTS):
        existing = [p for p in await partitions_of(conn, table) if p.upper is not None]
        moment = _floor(start, step)
        while moment < end:
            for lower, upper in _uncovered(moment, moment + step, existing):
                name = _partition_name(table, lower, step)
                if await migrations.retrying(
                    conn,
                    f"making partition {name}",
                    max_lock_wait,
                    functools.partial(
                        _attach_new, table=table, name=name, lower=lower, upper=upper
                    ),
                ):
                    made.append(name)  # not made by a purge racing this one
            moment += step
    return made


def _uncovered(
    lower: datetime, upper: datetime, existing: list[Partition]
) -> list[tuple[datetime, datetime]]:
    """The parts of [``lower``, ``upper``) that no partition of ``existing`` covers."""
    gaps = [(lower, upper)]
    for part in existing:
        if part.upper is None:
            continue
        part_lower = part.lower or _MIN
        gaps = [
            piece
            for gap_lower, gap_upper in gaps
            for piece in (
                (gap_lower, min(gap_upper, part_lower)),
                (max(gap_lower, part.upper), gap_upper),
            )
            if piece[0] < piece[1]
        ]
    return gaps


async def _attach_new(
    conn: store.Connection, table: str, name: str, lower: datetime, upper: datetime
) -> bool:
    """Whether it made the partition (False: a racing purge had made it). As the tables' owner
    (migration 0021): the relay's role may not make tables."""
    async with conn.transaction():
        await _lock_timeout(conn)
        made: bool = await _fetchval(
            conn,
            "SELECT outbox_make_partition($1::regclass, $2, $3, $4)",
            table,
            name,
            lower,
            upper,
        )
        return made


# Processed rows by finish time: the plain table's index until migration 0020, kept (and made at
# the conversion) on the partitioned layout, where the drop of a partition reads it for live rows.
PROCESSED_INDEX = "outbox_messages_processed_idx"
_ON_PROCESSED = "ON outbox_messages (processed_at) WHERE status = 'Processed'"
# What a partition's drop carries over (migration 0021 holds the rule).
_LIVE = "outbox_message_is_live(status, processed_at, created_at, $1, $2::timestamptz)"


async def maintain(
    conn: store.Connection,
    *,
    retention_days: int,
    failed_retention_days: int | None,
    batch_size: int = 1000,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> PartitionReport:
    """The purge of the partitioned layout: partitions ahead made; every partition wholly past
    ``retention_days`` dropped, its live rows moved to the default partition (or the partition
    kept, when it has more than ``CARRY_LIMIT`` of them); the default partition's rows past
    retention deleted as the plain table's are; the history and caller-given ids of what is
    gone released."""
    report = PartitionReport()
    report.created = await ensure_partitions(conn, max_lock_wait=max_lock_wait)
    now: datetime = await _fetchval(conn, "SELECT now()")
    cutoff = now - timedelta(days=retention_days)
    failed_cutoff = (
        None if failed_retention_days is None else now - timedelta(days=failed_retention_days)
    )
    for part in await partitions_of(conn, MESSAGES):
        if part.upper is None or part.upper > cutoff:
            continue
        live = await _live_rows(conn, part.name, cutoff, failed_cutoff)
        if live is None:
            continue  # a purge racing this one dropped it meanwhile
        if live > CARRY_LIMIT:
            report.kept.append({"name": part.name, "live_rows_over": CARRY_LIMIT})
            logger.warning(
                "partition %s is past retention but holds more than %d live rows: kept",
                part.name,
                CARRY_LIMIT,
            )
            continue

        carried = await migrations.retrying(
            conn,
            f"dropping partition {part.name}",
            max_lock_wait,
            functools.partial(
                _drop, table=MESSAGES, name=part.name, cutoffs=(cutoff, failed_cutoff)
            ),
        )
        if carried is not None:  # None: a purge racing this one dropped it
            report.rows_carried += carried
            report.dropped.append(part.name)
    report.default_rows_deleted = await _purge_default(conn, cutoff, failed_cutoff, batch_size)
    await _drop_attempts(conn, cutoff, max_lock_wait, report)
    report.ids_released = await _release_ids(conn, batch_size)
    return report


@store.database_boundary
async def _live_rows(
    conn: store.Connection, name: str, cutoff: datetime, failed_cutoff: datetime | None
) -> int | None:
    """The live rows of partition ``name`` (up to ``CARRY_LIMIT`` + 1); None when it is gone."""
    try:
        live: int = await conn.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM {_ident(name)} WHERE {_LIVE} "
            f"LIMIT {CARRY_LIMIT + 1}) AS live",
            cutoff,
            failed_cutoff,
            timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS,
        )
    except asyncpg.UndefinedTableError:
        return None
    return live


async def _drop(
    conn: store.Connection,
    table: str,
    name: str,
    cutoffs: tuple[datetime | None, datetime | None] = (None, None),
    kept_ids: list[uuid.UUID] | None = None,
) -> int | None:
    """Detach and drop one partition past retention, as the tables' owner (migration 0021),
    carrying over its live messages (``cutoffs``) or the history of ``kept_ids``: how many rows
    it carried, or None when a purge racing this one had dropped it."""
    async with conn.transaction():
        await _lock_timeout(conn, DROP_LOCK_TIMEOUT_SECONDS)
        carried: int | None = await _fetchval(
            conn,
            "SELECT outbox_drop_partition($1::regclass, $2, $3, $4, $5)",
            table,
            name,
            *cutoffs,
            kept_ids,
        )
        return carried


async def _purge_default(
    conn: store.Connection, cutoff: datetime, failed_cutoff: datetime | None, batch_size: int
) -> int:
    """The default partition's rows past retention, deleted in batches with their history."""
    total = 0
    while True:
        deleted = await _execute_count(
            conn,
            """
            WITH doomed AS (
                SELECT outbox_message_id FROM outbox_messages_default
                WHERE (status = 'Processed' AND processed_at < $1)
                   OR (status = 'Failed' AND created_at < $2::timestamptz)
                LIMIT $3
                FOR UPDATE SKIP LOCKED
            )
            DELETE FROM outbox_messages AS m
            USING doomed
            WHERE m.outbox_message_id = doomed.outbox_message_id
            """,
            cutoff,
            failed_cutoff,
            batch_size,
        )
        total += deleted
        if deleted < batch_size:
            return total


async def _drop_attempts(
    conn: store.Connection, cutoff: datetime, max_lock_wait: float, report: PartitionReport
) -> None:
    """Drop the attempts partitions wholly past retention; the history of messages still kept
    (created before the partition ended) moves to the attempts' default partition."""
    for part in await partitions_of(conn, ATTEMPTS):
        if part.upper is None or part.upper > cutoff:
            continue
        kept_ids = await _fetchval(
            conn,
            "SELECT array_agg(outbox_message_id) FROM ("
            "SELECT outbox_message_id FROM outbox_messages WHERE created_at < $1 "
            f"LIMIT {ATTEMPTS_CARRY_LIMIT + 1}) AS kept",
            part.upper,
        )
        if kept_ids is not None and len(kept_ids) > ATTEMPTS_CARRY_LIMIT:
            report.kept.append({"name": part.name, "messages_over": ATTEMPTS_CARRY_LIMIT})
            continue

        if (
            await migrations.retrying(
                conn,
                f"dropping partition {part.name}",
                max_lock_wait,
                functools.partial(_drop, table=ATTEMPTS, name=part.name, kept_ids=kept_ids or []),
            )
            is not None
        ):
            report.dropped.append(part.name)


async def _release_ids(conn: store.Connection, batch_size: int) -> int:
    """Caller-given ids whose message is gone, older than every partition still there. A claim
    holds its message's ``created_at`` (the same transaction's ``now()``, or the message's own
    at the conversion), so the probe for its message reads only where such a message can be:
    below the oldest partition, the default partition (pruned at planning, whatever the join)."""
    ranged = [p for p in await partitions_of(conn, MESSAGES) if p.upper is not None]
    if not ranged:
        return 0
    horizon = ranged[0].lower or _MIN
    total = 0
    while True:
        released = await _execute_count(
            conn,
            """
            DELETE FROM outbox_message_ids
            WHERE outbox_message_id IN (
                SELECT i.outbox_message_id FROM outbox_message_ids AS i
                WHERE i.created_at < $1
                  AND NOT EXISTS (SELECT 1 FROM outbox_messages AS m
                                  WHERE m.outbox_message_id = i.outbox_message_id
                                    AND m.created_at = i.created_at
                                    AND m.created_at < $1)
                LIMIT $2)
            """,
            horizon,
            batch_size,
        )
        total += released
        if released < batch_size:
            return total


# ---------------------------------------------------------------------------------------------
# Back to the plain table


async def convert_back(
    conn: store.Connection,
    *,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Convert the partitioned layout back to plain tables (or finish a conversion back that
    stopped): the plain tables take the names in one short transaction, then the rows move
    over in batches, live ones first (those not moved yet are not leased until they are; a
    message being delivered as it moves may be delivered again, never lost). Resumable."""
    async with store.migration_lock(conn):
        return await _convert_back(conn, max_lock_wait, batch_size)


async def _convert_back(
    conn: store.Connection, max_lock_wait: float, batch_size: int
) -> dict[str, Any]:
    switched = False
    if await is_partitioned(conn):
        await _prepare_plain(conn)
        await migrations.retrying(
            conn, "the switch to the plain tables", max_lock_wait, _switch_back
        )
        switched = True
    moved = {"messages": 0, "attempts": 0}
    if await _exists(conn, "outbox_messages_partitioned_old"):
        for table, label in ((MESSAGES, "messages"), (ATTEMPTS, "attempts")):
            # Live messages first (delivery resumes), then the rest, each pass in key order;
            # rows a relay held locked a moment ago are taken by the next round.
            passes = ("status <> 'Processed'", "true") if table == MESSAGES else ("true",)
            while await _fetchval(conn, f"SELECT EXISTS (SELECT 1 FROM {table}_partitioned_old)"):
                for condition in passes:
                    moved[label] += await _move_back(conn, table, condition, batch_size)
        await _execute(
            conn,
            "DROP TABLE outbox_messages_partitioned_old, outbox_attempts_partitioned_old, "
            "outbox_message_ids, outbox_partitioning",
        )
    return {"layout": "plain", "converted": switched, "rows_moved": moved}


async def _move_back(conn: store.Connection, table: str, condition: str, batch_size: int) -> int:
    old = f"{table}_partitioned_old"
    key = "outbox_message_id" if table == MESSAGES else "outbox_message_id, attempt_id"
    after = "($1::uuid IS NULL OR outbox_message_id > $1::uuid)"
    total, last = 0, None
    while True:
        row = await _fetchrow(
            conn,
            f"""
            WITH batch AS (
                SELECT {key} FROM {old}
                WHERE ({condition}) AND {after}
                ORDER BY {key}
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            ), moved AS (
                DELETE FROM {old} AS o USING batch AS b
                WHERE ({_key_columns(table, "o")}) = ({_key_columns(table, "b")})
                RETURNING o.*
            ), inserted AS (
                INSERT INTO {table} SELECT * FROM moved RETURNING outbox_message_id
            )
            SELECT count(*) AS moved,
                   (SELECT max(outbox_message_id::text)::uuid FROM batch) AS last,
                   (SELECT count(*) FROM batch) AS taken
            FROM inserted
            """,
            last,
            batch_size,
        )
        total += int(row["moved"])
        if row["taken"] < batch_size:
            return total
        # An attempt's key is (message, attempt): a batch may end inside one message's
        # history, so the next starts at that message again.
        last = row["last"] if table == MESSAGES else _before(row["last"])


def _before(message_id: Any) -> Any:
    """The id just before ``message_id`` in uuid order (its history is read again from it)."""
    if message_id is None or message_id.int == 0:
        return None
    return uuid.UUID(int=message_id.int - 1)


def _key_columns(table: str, alias: str) -> str:
    if table == MESSAGES:
        return f"{alias}.outbox_message_id"
    return f"{alias}.outbox_message_id, {alias}.attempt_id"


async def _prepare_plain(conn: store.Connection) -> None:
    await _execute(conn, "DROP TABLE IF EXISTS outbox_messages_next, outbox_attempts_next")
    for table in (MESSAGES, ATTEMPTS):
        await _execute(
            conn,
            f"CREATE TABLE {table}_next (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING COMMENTS)" + _storage(table),
        )
        key = "outbox_message_id" if table == MESSAGES else "outbox_message_id, attempt_id"
        await _execute(
            conn, f"ALTER TABLE {table}_next ADD CONSTRAINT {table}_pkey_next PRIMARY KEY ({key})"
        )
        for definition in await _index_definitions(conn, table):
            if _index_name(definition) == PROCESSED_INDEX:
                continue  # the plain table's purge does without it (migration 0020)
            await _execute(conn, _retarget(definition, table, f"{table}_next", "_next"))
    for trigger in _MESSAGE_TRIGGERS:
        await _execute(conn, trigger.format(table="outbox_messages_next"))


async def _switch_back(conn: store.Connection) -> None:
    async with conn.transaction():
        await _lock_timeout(conn)
        await _execute(conn, "LOCK TABLE outbox_messages, outbox_attempts IN ACCESS EXCLUSIVE MODE")
        await _execute(conn, "ALTER SEQUENCE outbox_attempts_id_seq OWNED BY NONE")
        for table in (MESSAGES, ATTEMPTS):
            for name in await _index_names(conn, table):
                await _execute(conn, f"ALTER INDEX {name} RENAME TO {_old_name(name, table)}")
            await _take_over(conn, table, f"{table}_partitioned_old")
        await _execute(
            conn, "ALTER SEQUENCE outbox_attempts_id_seq OWNED BY outbox_attempts.attempt_id"
        )
        await _execute(conn, _PLAIN_INSERT)


async def _take_over(conn: store.Connection, table: str, aside: str) -> None:
    """``table`` renamed ``aside`` (without the triggers that delete a message's history, which
    belong to the table in use), and ``{table}_next`` with its indexes given the names."""
    if table == MESSAGES:
        for trigger in _MESSAGE_TRIGGER_NAMES:
            await _execute(conn, f"DROP TRIGGER IF EXISTS {trigger} ON outbox_messages")
    await _execute(conn, f"ALTER TABLE {table} RENAME TO {aside}")
    await _execute(conn, f"ALTER TABLE {table}_next RENAME TO {table}")
    for name in await _index_names(conn, table):
        if name.endswith("_next"):
            await _execute(conn, f"ALTER INDEX {name} RENAME TO {name[: -len('_next')]}")


# ---------------------------------------------------------------------------------------------
# Statements and helpers

_MESSAGE_TRIGGER_NAMES = ("outbox_messages_delete_attempts", "outbox_messages_truncate_attempts")
_MESSAGE_TRIGGERS = (
    "CREATE TRIGGER outbox_messages_delete_attempts AFTER DELETE ON {table} "
    "REFERENCING OLD TABLE AS deleted_messages "
    "FOR EACH STATEMENT EXECUTE FUNCTION outbox_delete_attempts()",
    "CREATE TRIGGER outbox_messages_truncate_attempts AFTER TRUNCATE ON {table} "
    "FOR EACH STATEMENT EXECUTE FUNCTION outbox_truncate_attempts()",
)

# The plain table's: migration 0019's, put back by the conversion to the plain tables.
_PLAIN_INSERT = (
    migrations.MIGRATIONS_DIR.joinpath("0019_insert_message_function.sql")
    .read_text(encoding="utf-8")
    .replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
)
_CLAIM = """    INSERT INTO outbox_message_ids (outbox_message_id) VALUES (p_id)
    ON CONFLICT (outbox_message_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN;
    END IF;
"""
_NO_CONFLICT = "    ON CONFLICT (outbox_message_id) DO NOTHING\n"
# The partitioned layout's: the same insert, the id claimed first (a concurrent claim of the same
# id waits for the first transaction, as the plain table's unique index makes it wait).
# (tests/unit/test_payloads.py checks that both write the same row.)
_PARTITIONED_INSERT = _PLAIN_INSERT.replace(
    "    RETURN QUERY", _CLAIM + "    RETURN QUERY", 1
).replace(_NO_CONFLICT, "", 1)

_MIN = datetime(1, 1, 1, tzinfo=UTC)


def _storage(table: str) -> str:
    """The messages' room on each page for their next versions (migration 0009), on every
    partition: a partitioned table keeps no storage parameters of its own."""
    return " WITH (fillfactor = 50)" if table == MESSAGES else ""


def _floor(moment: datetime, step: timedelta) -> datetime:
    moment = moment.astimezone(UTC)
    if step >= timedelta(days=1):
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(minute=0, second=0, microsecond=0)


def _partition_name(table: str, lower: datetime, step: timedelta) -> str:
    lower = lower.astimezone(UTC)
    stamp = lower.strftime("%Y%m%d") if step >= timedelta(days=1) else lower.strftime("%Y%m%d_%H")
    if lower != _floor(lower, step):  # the conversion's first partition starts mid-interval
        stamp += lower.strftime("_%H%M%S")
    return f"{table}_p{stamp}"


def _legacy_name(name: str, table: str) -> str:
    return name.replace(table, f"{table}_legacy", 1) if name.startswith(table) else name + "_legacy"


def _old_name(name: str, table: str) -> str:
    return name.replace(table, f"{table}_pold", 1) if name.startswith(table) else name + "_pold"


def _ident(name: str) -> str:
    if not _SUFFIX.match(name):
        raise MigrationError(f"unexpected table name {name!r}")
    return name


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _index_name(definition: str) -> str:
    """The name in ``CREATE [UNIQUE] INDEX name ON …``."""
    return definition.split(" INDEX ", 1)[1].split(" ", 1)[0]


def _retarget(definition: str, table: str, target: str, suffix: str) -> str:
    """``CREATE INDEX name ON [ONLY] public.table …`` as the same index of ``target``."""
    match = re.match(
        r"CREATE (UNIQUE )?INDEX (\S+) ON (?:ONLY )?(?:\S+\.)?" + re.escape(table) + r" (.*)$",
        definition,
        re.DOTALL,
    )
    if match is None:
        raise MigrationError(f"cannot read the index definition {definition!r}")
    unique, name, rest = match.groups()
    return f"CREATE {unique or ''}INDEX {name}{suffix} ON {target} {rest}"


async def _index_definitions(conn: store.Connection, table: str) -> list[str]:
    """Every index of ``table`` but its primary key and the conversion's own keys."""
    rows = await _fetch(
        conn,
        """
        SELECT pg_get_indexdef(i.indexrelid) AS definition
        FROM pg_index AS i
        JOIN pg_class AS c ON c.oid = i.indexrelid
        WHERE i.indrelid = to_regclass($1) AND NOT i.indisprimary
          AND c.relname NOT LIKE '%\\_legacy\\_key'
        ORDER BY c.relname
        """,
        table,
    )
    return [row["definition"] for row in rows]


async def _index_names(conn: store.Connection, table: str) -> list[str]:
    rows = await _fetch(
        conn,
        "SELECT c.relname FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = to_regclass($1) ORDER BY c.relname",
        table,
    )
    return [row["relname"] for row in rows]


async def _exists(conn: store.Connection, name: str) -> bool:
    return bool(await _fetchval(conn, "SELECT to_regclass($1) IS NOT NULL", name))


async def _lock_timeout(
    conn: store.Connection, seconds: float = migrations.LOCK_TIMEOUT_SECONDS
) -> None:
    milliseconds = int(seconds * 1000)
    await _execute(conn, f"SET LOCAL lock_timeout = '{milliseconds}ms'")


@store.database_boundary
async def _execute(conn: store.Connection, statement: str) -> None:
    await conn.execute(statement, timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS)


@store.database_boundary
async def _execute_count(conn: store.Connection, statement: str, *args: Any) -> int:
    result: str = await conn.execute(
        statement, *args, timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS
    )
    return int(result.split()[-1])


@store.database_boundary
async def _fetchval(conn: store.Connection, statement: str, *args: Any) -> Any:
    return await conn.fetchval(statement, *args, timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS)


@store.database_boundary
async def _fetchrow(conn: store.Connection, statement: str, *args: Any) -> asyncpg.Record:
    return await conn.fetchrow(statement, *args, timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS)


@store.database_boundary
async def _fetch(conn: store.Connection, statement: str, *args: Any) -> list[asyncpg.Record]:
    return list(
        await conn.fetch(statement, *args, timeout=store.MIGRATION_STATEMENT_TIMEOUT_SECONDS)
    )
