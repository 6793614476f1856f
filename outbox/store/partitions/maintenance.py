"""The partitioned layout's upkeep (its ``purge``): partitions made ahead of time, and retention by
partition.

Retention drops partitions instead of deleting rows: a partition whose every row is older than
the retention is dropped whole, in one short transaction, whatever the number of its rows. Its
live rows (Pending, Processing, Processed within the retention, Failed within theirs) are not
lost: when there are at most ``CARRY_LIMIT`` of them they are moved, in the same transaction, to
the default partition (their ``created_at`` is kept, so no partition covers them any more), where
later purges delete them row by row once they are past retention; a partition with more of them
is kept until it has few enough, and ``status`` shows it. Making and dropping run as the tables'
owner (migration 0021's functions): the relay's role may not make or drop tables.
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from outbox.core.errors import DatabaseError
from outbox.store import migrate as migrations
from outbox.store.connection import Connection
from outbox.store.partitions import ddl
from outbox.store.partitions.layout import Partition, interval_of, lock_timeout, partitions_of
from outbox.store.partitions.naming import (
    AHEAD,
    ATTEMPTS,
    INTERVALS,
    MESSAGES,
    MIN,
    floor,
    partition_name,
    plain,
)

logger = logging.getLogger("outbox.partitions")

# The live rows a partition past retention may hold and still be dropped: they are moved to the
# default partition in the transaction that drops it (under its lock, so few).
CARRY_LIMIT = 10_000
# How long a partition's drop waits for its lock on the parent before it gives way and tries again:
# every producer and relay that comes meanwhile waits behind it (docs/partitioning.md).
DROP_LOCK_TIMEOUT_SECONDS = 0.02
# The attempt history of messages still kept that an attempts partition may hold and be dropped.
ATTEMPTS_CARRY_LIMIT = 100_000


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


async def ensure_partitions(
    conn: Connection,
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
        moment = floor(start, step)
        while moment < end:
            for lower, upper in _uncovered(moment, moment + step, existing):
                name = partition_name(table, lower, step)
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
        part_lower = part.lower or MIN
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
    conn: Connection, table: str, name: str, lower: datetime, upper: datetime
) -> bool:
    """Whether it made the partition (False: a racing purge had made it)."""
    async with conn.transaction():
        await lock_timeout(conn)
        made: bool = await ddl.fetchval(conn, "make_partition", table, name, lower, upper)
        return made


async def maintain(
    conn: Connection,
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
    now: datetime = await ddl.fetchval(conn, "now")
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


async def _live_rows(
    conn: Connection, name: str, cutoff: datetime, failed_cutoff: datetime | None
) -> int | None:
    """The live rows of partition ``name`` (up to ``CARRY_LIMIT`` + 1); None when it is gone."""
    try:
        live: int = await ddl.fetchval(
            conn, "live_rows", cutoff, failed_cutoff, CARRY_LIMIT + 1, name=plain(name)
        )
    except DatabaseError as exc:
        if exc.kind == "UndefinedTableError":
            return None
        raise
    return live


async def _drop(
    conn: Connection,
    table: str,
    name: str,
    cutoffs: tuple[datetime | None, datetime | None] = (None, None),
    kept_ids: list[uuid.UUID] | None = None,
) -> int | None:
    """Detach and drop one partition past retention, carrying over its live messages
    (``cutoffs``) or the history of ``kept_ids``: how many rows it carried, or None when a purge
    racing this one had dropped it."""
    async with conn.transaction():
        await lock_timeout(conn, DROP_LOCK_TIMEOUT_SECONDS)
        carried: int | None = await ddl.fetchval(
            conn, "drop_partition", table, name, *cutoffs, kept_ids
        )
        return carried


async def _purge_default(
    conn: Connection, cutoff: datetime, failed_cutoff: datetime | None, batch_size: int
) -> int:
    """The default partition's rows past retention, deleted in batches with their history."""
    total = 0
    while True:
        deleted = await ddl.execute(conn, "purge_default", cutoff, failed_cutoff, batch_size)
        total += deleted
        if deleted < batch_size:
            return total


async def _drop_attempts(
    conn: Connection, cutoff: datetime, max_lock_wait: float, report: PartitionReport
) -> None:
    """Drop the attempts partitions wholly past retention; the history of messages still kept
    (created before the partition ended) moves to the attempts' default partition."""
    for part in await partitions_of(conn, ATTEMPTS):
        if part.upper is None or part.upper > cutoff:
            continue
        kept_ids = await ddl.fetchval(
            conn, "kept_message_ids", part.upper, ATTEMPTS_CARRY_LIMIT + 1
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


async def _release_ids(conn: Connection, batch_size: int) -> int:
    """Caller-given ids whose message is gone, older than every partition still there. A claim
    holds its message's ``created_at`` (the same transaction's ``now()``, or the message's own
    at the conversion), so the probe for its message reads only where such a message can be:
    below the oldest partition, the default partition (pruned at planning, whatever the join)."""
    ranged = [p for p in await partitions_of(conn, MESSAGES) if p.upper is not None]
    if not ranged:
        return 0
    horizon = ranged[0].lower or MIN
    total = 0
    while True:
        released = await ddl.execute(conn, "release_ids", horizon, batch_size)
        total += released
        if released < batch_size:
            return total
