"""The conversion from the plain tables (``python -m outbox migrate --partitioned``).

It keeps every row where it is: the plain table becomes the layout's first partition
(``outbox_messages_legacy``, every time before the conversion), after a unique index it needs has
been built without blocking anyone. The switch itself is one short transaction (renames, two
empty partitions); until the legacy partition is attached after it (checked by a constraint
validated without blocking), the messages enqueued before the conversion are not leased. It is
resumable: run it again after any failure.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from outbox.core.errors import MigrationError
from outbox.store import migrate as migrations
from outbox.store import schema
from outbox.store.connection import Connection
from outbox.store.partitions import ddl
from outbox.store.partitions.layout import (
    PARTITIONED_INSERT,
    add_message_triggers,
    copy_indexes,
    exists,
    index_names,
    interval_of,
    is_partitioned,
    lock_timeout,
    take_over,
)
from outbox.store.partitions.maintenance import ensure_partitions
from outbox.store.partitions.naming import (
    ATTEMPTS,
    DEFAULT_INTERVAL,
    INTERVALS,
    MESSAGES,
    PARTITION_KEYS,
    PROCESSED_INDEX,
    floor,
    legacy_name,
    partition_name,
    primary_key,
)

# Caller-given ids claimed per transaction.
BATCH_SIZE = 10_000
# The plain tables' keys with their partition key, each index and the statement that builds it.
_LEGACY_KEYS = (
    ("outbox_messages_legacy_key", "create_messages_legacy_key"),
    ("outbox_attempts_legacy_key", "create_attempts_legacy_key"),
)


async def convert(
    conn: Connection,
    *,
    interval: str = DEFAULT_INTERVAL,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> dict[str, Any]:
    """Convert the plain tables to the partitioned layout (or finish a conversion that stopped
    half-way), then make the partitions ahead. On the partitioned layout already, only the
    latter. Run after the numbered migrations (``migrate``), under the migrators' advisory lock.
    """
    async with schema.migration_lock(conn):
        return await _convert(conn, interval, max_lock_wait)


async def _convert(conn: Connection, interval: str, max_lock_wait: float) -> dict[str, Any]:
    if interval not in INTERVALS:
        raise MigrationError(f"partition interval must be one of {', '.join(INTERVALS)}")
    if await exists(conn, "outbox_messages_partitioned_old"):
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


async def _prepare(conn: Connection, interval: str) -> None:
    """Everything that needs no strong lock: the new parents (empty, used by no one yet) and the
    unique indexes and checks the plain tables need to become their partitions."""
    await ddl.execute(conn, "drop_next_tables")
    await ddl.execute(conn, "create_partitioning")
    await ddl.execute(conn, "clear_partitioning")
    await ddl.execute(conn, "set_partitioning", interval)
    await ddl.execute(conn, "create_message_ids")
    await ddl.execute(conn, "create_message_ids_index")
    await ddl.execute(conn, "create_attempts_sequence")
    # The partitioned layout's purge finds live rows by processed_at under a partition's lock;
    # the plain table has no such index since migration 0020: built first, without blocking, so
    # that the parent gets it below and the plain table enters as a partition with it.
    await schema.build_index_concurrently(
        conn, PROCESSED_INDEX, ddl.statement("create_processed_index")
    )
    for table, key in PARTITION_KEYS:
        await ddl.execute(conn, "create_partitioned_next", table=table, key=key)
        columns = primary_key(table, partitioned=True)
        await ddl.execute(conn, "add_next_key", table=table, columns=columns)
        await copy_indexes(conn, table)
        await ddl.run(conn, ddl.stored("create_default_partition", table))
    await ddl.execute(conn, "number_next_attempts")
    await ddl.execute(conn, "own_attempt_ids_next")
    await add_message_triggers(conn, "outbox_messages_next")
    # The plain tables' keys as the parents' keys (the partition key in them), built without
    # blocking; and the ordering check of migration 0002 validated (a partition's checks must be).
    for index, which in _LEGACY_KEYS:
        await schema.build_index_concurrently(conn, index, ddl.statement(which))
    await ddl.execute(conn, "validate_ordering_check")


async def _switch(conn: Connection) -> None:
    """One short transaction: the plain tables step aside (renamed ``…_legacy``), the new
    parents take their names, with a first partition from this moment on. Producers and relays
    wait for it at most the lock timeout, then use the new tables."""
    async with conn.transaction():
        await lock_timeout(conn)
        await ddl.execute(conn, "lock_tables")
        # Every row of the plain tables was written before this moment (their writers have
        # committed): from it on, the partitions take the new ones.
        bound: datetime = await ddl.fetchval(conn, "clock")
        step = INTERVALS[await interval_of(conn)]
        first_upper = floor(bound, step) + step
        await ddl.fetchval(conn, "continue_attempt_ids")
        for table in (MESSAGES, ATTEMPTS):
            await ddl.execute(conn, "legacy_primary_key", table=table)
            for name in await index_names(conn, table):
                if not name.startswith(f"{table}_legacy"):
                    new_name = legacy_name(name, table)
                    await ddl.execute(conn, "rename_index", name=name, new_name=new_name)
            if table == ATTEMPTS:
                await ddl.execute(conn, "drop_attempts_identity")
            await take_over(conn, table, f"{table}_legacy")
            first = partition_name(table, bound, step)
            made = ddl.stored("create_partition", table, name=first, lower=bound, upper=first_upper)
            await ddl.run(conn, made)
            await ddl.fetchval(conn, "unsummarise_first_ranges", first)
        await ddl.run(conn, PARTITIONED_INSERT)
        await ddl.execute(conn, "set_legacy_bound", bound)


async def _finish_legacy(conn: Connection, max_lock_wait: float) -> bool:
    """Attach the plain tables as the partitions of every time before the conversion, then
    claim their ids in outbox_message_ids. Both idempotent; False when there was nothing left."""
    bound = await ddl.fetchval(conn, "legacy_bound")
    did = False
    for table, key in PARTITION_KEYS:
        legacy = f"{table}_legacy"
        if not await exists(conn, legacy) or await ddl.fetchval(conn, "is_partition", legacy):
            continue
        if not await ddl.fetchval(conn, "has_rows", table=legacy) and not (
            await ddl.fetchval(conn, "default_has_rows_before", bound, table=table, key=key)
        ):
            await ddl.execute(conn, "drop_table", table=legacy)  # a new install's: nothing kept
            did = True
            continue
        # Validated without blocking (no one writes the legacy table any more): the attach
        # then skips its own scan, which would hold the default partition's lock meanwhile.
        await ddl.execute(conn, "bound_legacy", table=table, key=key, bound=bound)
        await ddl.execute(conn, "validate_legacy_bound", table=table)

        async def attach(conn: Connection, table: str = table, key: str = key) -> None:
            async with conn.transaction():
                await lock_timeout(conn)
                await ddl.execute(conn, "move_default_to_legacy", table=table, key=key, bound=bound)
                await ddl.execute(conn, "attach_legacy", table=table, bound=bound)

        await migrations.retrying(conn, f"attaching {legacy}", max_lock_wait, attach)
        did = True
    if bound is not None and not await ddl.fetchval(conn, "ids_copied"):
        if await exists(conn, "outbox_messages_legacy"):
            await _copy_legacy_ids(conn)
        await ddl.execute(conn, "set_ids_copied")
        did = True
    return did


async def _copy_legacy_ids(conn: Connection) -> None:
    """Every id from before the conversion, claimed in batches (its own transaction each)."""
    last = None
    while True:
        last = await ddl.fetchval(conn, "copy_legacy_ids", last, BATCH_SIZE)
        if last is None:
            return
