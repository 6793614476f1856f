"""Which layout the tables have, and what both conversions share: reading the partitions and the
indexes, the triggers and the insert function each layout has, a table stepping aside for another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox.store import migrate as migrations
from outbox.store.connection import Connection
from outbox.store.partitions import ddl
from outbox.store.partitions.naming import (
    DEFAULT_INTERVAL,
    MESSAGES,
    MIN,
    index_name,
    iso,
    plain,
    retarget,
)


@dataclass(slots=True)
class Partition:
    name: str
    lower: datetime | None  # None: MINVALUE (the legacy partition)
    upper: datetime | None  # None: the default partition


async def is_partitioned(conn: Connection) -> bool:
    return bool(await ddl.fetchval(conn, "is_partitioned"))


async def interval_of(conn: Connection) -> str:
    if await ddl.fetchval(conn, "partitioning_missing"):
        return DEFAULT_INTERVAL
    value = await ddl.fetchval(conn, "partition_interval")
    return str(value or DEFAULT_INTERVAL)


async def partitions_of(conn: Connection, table: str) -> list[Partition]:
    """The partitions of ``table``, oldest first, the default partition last."""
    rows = await ddl.fetch(conn, "partitions_of", table)
    return [
        Partition(row["name"], row["lower"], None if row["is_default"] else row["upper"])
        for row in rows
    ]


async def describe(conn: Connection) -> dict[str, Any]:
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
            "from": iso(oldest.lower),
            "to": iso(oldest.upper),
            "live_rows": await ddl.fetchval(conn, "live_rows_of", name=plain(oldest.name)),
        }
    default = next((p for p in partitions if p.upper is None), None)
    if default is not None:
        since = oldest.lower if oldest is not None and oldest.lower is not None else MIN
        row = await ddl.fetchrow(conn, "default_rows", since, name=plain(default.name))
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


async def index_definitions(conn: Connection, table: str) -> list[str]:
    """Every index of ``table`` but its primary key and the conversion's own keys."""
    return [row["definition"] for row in await ddl.fetch(conn, "index_definitions", table)]


async def index_names(conn: Connection, table: str) -> list[str]:
    return [row["relname"] for row in await ddl.fetch(conn, "index_names", table)]


async def copy_indexes(conn: Connection, table: str, *, skip: str | None = None) -> None:
    """``table``'s indexes (but ``skip``) made again on ``{table}_next``, named ``…_next``."""
    for definition in await index_definitions(conn, table):
        if skip is None or index_name(definition) != skip:
            await ddl.run(conn, retarget(definition, table, f"{table}_next", "_next"))


async def exists(conn: Connection, name: str) -> bool:
    return bool(await ddl.fetchval(conn, "relation_exists", name))


async def lock_timeout(conn: Connection, seconds: float = migrations.LOCK_TIMEOUT_SECONDS) -> None:
    """How long the statements of the transaction under way wait for a lock."""
    await ddl.fetchval(conn, "set_local_lock_timeout", f"{int(seconds * 1000)}ms")


_MESSAGE_TRIGGERS = ("outbox_messages_delete_attempts", "outbox_messages_truncate_attempts")


async def add_message_triggers(conn: Connection, table: str) -> None:
    """The triggers that delete a deleted message's history, on ``table``."""
    await ddl.execute(conn, "create_delete_trigger", table=table)
    await ddl.execute(conn, "create_truncate_trigger", table=table)


async def take_over(conn: Connection, table: str, aside: str) -> None:
    """``table`` renamed ``aside`` (without the triggers that delete a message's history, which
    belong to the table in use), and ``{table}_next`` with its indexes given the names."""
    if table == MESSAGES:
        for trigger in _MESSAGE_TRIGGERS:
            await ddl.execute(conn, "drop_trigger", name=trigger)
    await ddl.execute(conn, "rename_table", name=table, new_name=aside)
    await ddl.execute(conn, "rename_table", name=f"{table}_next", new_name=table)
    for name in await index_names(conn, table):
        if name.endswith("_next"):
            await ddl.execute(conn, "rename_index", name=name, new_name=name[: -len("_next")])


# The plain table's insert function: migration 0019's, put back by the conversion to the plain
# tables.
PLAIN_INSERT = (
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
NO_CONFLICT = "    ON CONFLICT (outbox_message_id) DO NOTHING\n"
# The partitioned layout's: the same insert, the id claimed first (a concurrent claim of the same
# id waits for the first transaction, as the plain table's unique index makes it wait).
# (tests/unit/test_payloads.py checks that both write the same row.)
PARTITIONED_INSERT = PLAIN_INSERT.replace(
    "    RETURN QUERY", _CLAIM + "    RETURN QUERY", 1
).replace(NO_CONFLICT, "", 1)
