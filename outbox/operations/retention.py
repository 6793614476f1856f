"""Retention (``python -m outbox purge``, the daily timer): old Processed rows deleted (and old
Failed ones, if a retention is set for them), batch by batch; on the partitioned layout whole
partitions dropped instead (``store.partitions.maintain``). ``purge_inbox`` is the consumer
inbox's (``python -m outbox purge --inbox``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from outbox.operations import sql
from outbox.store import partitions
from outbox.store.connection import Connection, acquired

# Where a purge of Processed rows goes on: the (created_at, id) of the last row it deleted.
PurgePosition = tuple[datetime, UUID]
# Inbox rows deleted per purge transaction.
INBOX_PURGE_BATCH_SIZE = 1000


@dataclass(slots=True)
class PurgeReport:
    processed_deleted: int = 0
    failed_deleted: int = 0
    batches: int = 0
    # The partitioned layout's (docs/partitioning.md): what was made, dropped, moved and kept.
    layout: str = "plain"
    partitions: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The plain layout's report as it always was; the partitioned one's adds its own."""
        report = asdict(self)
        if self.partitions is None:
            del report["layout"], report["partitions"]
        return report


async def purge(
    conn: Connection,
    *,
    retention_days: int,
    failed_retention_days: int | None,
    batch_size: int,
) -> PurgeReport:
    """Delete old Processed rows (and old Failed ones if a retention is set for them).

    Batch by batch, each in its own short transaction, skipping locked rows: it never holds a long
    lock and never waits for a relay. Attempt history goes with its message. On the partitioned
    layout, partitions are made ahead and those past retention dropped instead
    (``partitions.maintain``).
    """
    async with acquired(conn) as connection:
        if await partitions.is_partitioned(connection):
            done = await partitions.maintain(
                connection,
                retention_days=retention_days,
                failed_retention_days=failed_retention_days,
                batch_size=batch_size,
            )
            return PurgeReport(layout="partitioned", partitions=done.as_dict())
        report = PurgeReport()
        report.processed_deleted = await _purge(
            connection, "Processed", retention_days, batch_size, report
        )
        if failed_retention_days is not None:
            report.failed_deleted = await _purge(
                connection, "Failed", failed_retention_days, batch_size, report
            )
        return report


async def _purge(
    conn: Connection, status: str, days: int, batch_size: int, report: PurgeReport
) -> int:
    total = 0
    # Processed rows are read in created order, each batch after the last row the one before
    # deleted: rows finished within retention are passed over once, not at every batch.
    after: PurgePosition | None = None
    while True:
        if status == "Processed":
            deleted, last = await purge_processed(conn, days, batch_size, after)
            after = last or after
        else:
            deleted = await purge_batch(conn, status, days, batch_size)
        report.batches += 1
        total += deleted
        if deleted < batch_size:
            return total


async def purge_batch(conn: Connection, status: str, older_than_days: int, limit: int) -> int:
    """Delete one bounded batch of old Processed or Failed rows; returns how many went."""
    if status == "Processed":
        deleted, _ = await purge_processed(conn, older_than_days, limit)
        return deleted
    return await sql.execute(conn, "purge_failed", older_than_days, limit)


async def purge_processed(
    conn: Connection, older_than_days: int, limit: int, after: PurgePosition | None = None
) -> tuple[int, PurgePosition | None]:
    """Delete one bounded batch of Processed rows finished more than ``older_than_days`` ago,
    read in created order after ``after``; how many went, and the position of the last one
    (None if none went), where the next batch goes on."""
    created_at, message_id = after if after is not None else (None, None)
    row = await sql.row(conn, "purge_processed", older_than_days, limit, created_at, message_id)
    assert row is not None  # one row, whatever was deleted
    last = None if row["created_at"] is None else (row["created_at"], row["outbox_message_id"])
    return int(row["deleted"]), last


@dataclass(slots=True)
class InboxPurgeReport:
    inbox_deleted: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def purge_inbox(
    conn: Connection, *, older_than_days: int, batch_size: int = INBOX_PURGE_BATCH_SIZE
) -> InboxPurgeReport:
    """Delete inbox rows received more than ``older_than_days`` ago, batch by batch, each in its
    own short transaction, skipping rows a consumer holds locked.

    A redelivery of a purged id would be processed again: keep rows longer than any event can
    come back (retries, and requeues by hand).
    """
    report = InboxPurgeReport()
    while True:
        deleted = await sql.execute(conn, "purge_inbox", older_than_days, batch_size)
        report.batches += 1
        report.inbox_deleted += deleted
        if deleted < batch_size:
            return report
