"""The way back to the plain tables (``python -m outbox migrate --plain``): the plain tables take
the names in one short transaction, then the rows move over in batches, live ones first."""

from __future__ import annotations

import uuid
from typing import Any

from outbox.store import migrate as migrations
from outbox.store import schema
from outbox.store.connection import Connection
from outbox.store.partitions import ddl
from outbox.store.partitions.layout import (
    PLAIN_INSERT,
    add_message_triggers,
    copy_indexes,
    exists,
    index_names,
    is_partitioned,
    lock_timeout,
    take_over,
)
from outbox.store.partitions.naming import (
    ATTEMPTS,
    MESSAGES,
    PROCESSED_INDEX,
    old_name,
    primary_key,
)

# Rows moved back to a plain table per transaction.
BATCH_SIZE = 10_000
# Each table's passes, in order, and the statement of each: live messages first (delivery
# resumes), then the rest; the history in one pass.
_PASSES = {
    MESSAGES: ("move_live_messages_back", "move_messages_back"),
    ATTEMPTS: ("move_attempts_back",),
}


async def convert_back(
    conn: Connection,
    *,
    max_lock_wait: float = migrations.DEFAULT_MAX_LOCK_WAIT_SECONDS,
    batch_size: int = BATCH_SIZE,
) -> dict[str, Any]:
    """Convert the partitioned layout back to plain tables (or finish a conversion back that
    stopped): the plain tables take the names in one short transaction, then the rows move
    over in batches, live ones first (those not moved yet are not leased until they are; a
    message being delivered as it moves may be delivered again, never lost). Resumable."""
    async with schema.migration_lock(conn):
        return await _convert_back(conn, max_lock_wait, batch_size)


async def _convert_back(conn: Connection, max_lock_wait: float, batch_size: int) -> dict[str, Any]:
    switched = False
    if await is_partitioned(conn):
        await _prepare_plain(conn)
        await migrations.retrying(
            conn, "the switch to the plain tables", max_lock_wait, _switch_back
        )
        switched = True
    moved = {"messages": 0, "attempts": 0}
    if await exists(conn, "outbox_messages_partitioned_old"):
        for table, label in ((MESSAGES, "messages"), (ATTEMPTS, "attempts")):
            # Each pass in key order; rows a relay held locked a moment ago are taken by the
            # next round.
            old = f"{table}_partitioned_old"
            while await ddl.fetchval(conn, "has_rows", table=old):
                for which in _PASSES[table]:
                    moved[label] += await _move_back(conn, which, table, batch_size)
        await ddl.execute(conn, "drop_partitioned_leftovers")
    return {"layout": "plain", "converted": switched, "rows_moved": moved}


async def _move_back(conn: Connection, which: str, table: str, batch_size: int) -> int:
    total, last = 0, None
    while True:
        row = await ddl.fetchrow(conn, which, last, batch_size)
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


async def _prepare_plain(conn: Connection) -> None:
    await ddl.execute(conn, "drop_next_tables")
    for table in (MESSAGES, ATTEMPTS):
        await ddl.run(conn, ddl.stored("create_plain_next", table))
        columns = primary_key(table, partitioned=False)
        await ddl.execute(conn, "add_next_key", table=table, columns=columns)
        # The plain table's purge does without the processed index (migration 0020).
        await copy_indexes(conn, table, skip=PROCESSED_INDEX)
    await add_message_triggers(conn, "outbox_messages_next")


async def _switch_back(conn: Connection) -> None:
    async with conn.transaction():
        await lock_timeout(conn)
        await ddl.execute(conn, "lock_tables")
        await ddl.execute(conn, "disown_attempt_ids")
        for table in (MESSAGES, ATTEMPTS):
            for name in await index_names(conn, table):
                await ddl.execute(conn, "rename_index", name=name, new_name=old_name(name, table))
            await take_over(conn, table, f"{table}_partitioned_old")
        await ddl.execute(conn, "own_attempt_ids")
        await ddl.run(conn, PLAIN_INSERT)
