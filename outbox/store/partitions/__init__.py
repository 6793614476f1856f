"""The partitioned layout of the outbox (``python -m outbox migrate --partitioned``), its
retention by partition, and the way back (``migrate --plain``).

``outbox_messages`` is range-partitioned by ``created_at``, ``outbox_attempts`` by
``recorded_at``, one partition per UTC day (or hour), with the same columns, statuses, indexes and
names as the plain tables: producers, the relay, ``show``, ``status``, ``requeue`` and the console
run the same statements on either layout. Each table has a default partition, a safety net for a
row no partition covers (``status`` reports it); ``purge`` makes partitions ahead of time, so it
stays empty while the purge runs.

- A primary key of a partitioned table must hold its partition key: ``(outbox_message_id,
  created_at)``. A caller-given id (``enqueue(message_id=…)``) is claimed in
  ``outbox_message_ids`` (one row per such id, dropped with its message), so a second message
  with the id still raises DuplicateMessageError, under every isolation level. An id the producer
  generated (a random UUID) is not recorded there, as on the plain table it is not looked up.
- Every statement that finds a message by its id alone looks it up in each partition's index.

A module per lifecycle: ``conversion`` (plain → partitioned, ``convert``), ``maintenance``
(partitions ahead and retention, ``maintain``), ``reversal`` (back to plain, ``convert_back``);
``layout`` reads which layout the tables have and holds what the conversions share; ``naming``
names tables, partitions and indexes; ``ddl`` runs the statements of ``partitions.sql``.
"""

from outbox.store.partitions.conversion import convert
from outbox.store.partitions.layout import (
    Partition,
    describe,
    interval_of,
    is_partitioned,
    layout_problems,
    partitions_of,
)
from outbox.store.partitions.maintenance import PartitionReport, ensure_partitions, maintain
from outbox.store.partitions.naming import AHEAD, DEFAULT_INTERVAL, INTERVALS
from outbox.store.partitions.reversal import convert_back

__all__ = [
    "AHEAD",
    "DEFAULT_INTERVAL",
    "INTERVALS",
    "Partition",
    "PartitionReport",
    "convert",
    "convert_back",
    "describe",
    "ensure_partitions",
    "interval_of",
    "is_partitioned",
    "layout_problems",
    "maintain",
    "partitions_of",
]
