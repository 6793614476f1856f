"""What the partitioned layout calls things: its tables, each partition after the time it starts,
the names a table's indexes take while it steps aside, and the intervals a partition spans."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from outbox.core.errors import MigrationError

MESSAGES = "outbox_messages"
ATTEMPTS = "outbox_attempts"
# Each table and the column it is partitioned by.
PARTITION_KEYS = ((MESSAGES, "created_at"), (ATTEMPTS, "recorded_at"))
INTERVALS = {"daily": timedelta(days=1), "hourly": timedelta(hours=1)}
DEFAULT_INTERVAL = "daily"
# Partitions made ahead of the present: three days of daily ones, two days of hourly ones. The
# daily purge makes the next ones; a purge that did not run for longer than that leaves new rows
# in the default partition (reported), never refused.
AHEAD = {"daily": 3, "hourly": 48}
# Processed rows by finish time: the plain table's index until migration 0020, kept (and made at
# the conversion) on the partitioned layout, where the drop of a partition reads it for live rows.
PROCESSED_INDEX = "outbox_messages_processed_idx"
# The start of every time: the legacy partition's lower bound (MINVALUE).
MIN = datetime(1, 1, 1, tzinfo=UTC)
_PLAIN_NAME = re.compile(r"^[a-z0-9_]+$")


def primary_key(table: str, *, partitioned: bool) -> tuple[str, ...]:
    """The columns of ``table``'s primary key: with its partition key on the partitioned layout."""
    if table == MESSAGES:
        return ("outbox_message_id", "created_at") if partitioned else ("outbox_message_id",)
    if partitioned:
        return ("outbox_message_id", "attempt_id", "recorded_at")
    return ("outbox_message_id", "attempt_id")


def storage(table: str) -> str:
    """The messages' room on each page for their next versions (migration 0009), on every
    partition: a partitioned table keeps no storage parameters of its own."""
    return " WITH (fillfactor = 50)" if table == MESSAGES else ""


def floor(moment: datetime, step: timedelta) -> datetime:
    """The start of the interval ``step`` that holds ``moment``, in UTC."""
    moment = moment.astimezone(UTC)
    if step >= timedelta(days=1):
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(minute=0, second=0, microsecond=0)


def partition_name(table: str, lower: datetime, step: timedelta) -> str:
    """``outbox_messages_p20260102`` (daily), ``…_p20260102_03`` (hourly)."""
    lower = lower.astimezone(UTC)
    stamp = lower.strftime("%Y%m%d") if step >= timedelta(days=1) else lower.strftime("%Y%m%d_%H")
    if lower != floor(lower, step):  # the conversion's first partition starts mid-interval
        stamp += lower.strftime("_%H%M%S")
    return f"{table}_p{stamp}"


def legacy_name(name: str, table: str) -> str:
    """An index's name once its plain table is the legacy partition."""
    return name.replace(table, f"{table}_legacy", 1) if name.startswith(table) else name + "_legacy"


def old_name(name: str, table: str) -> str:
    """An index's name once its partitioned table steps aside (the way back)."""
    return name.replace(table, f"{table}_pold", 1) if name.startswith(table) else name + "_pold"


def plain(name: str) -> str:
    """``name`` if it is a table name the layout makes, else MigrationError."""
    if not _PLAIN_NAME.match(name):
        raise MigrationError(f"unexpected table name {name!r}")
    return name


def index_name(definition: str) -> str:
    """The name in ``CREATE [UNIQUE] INDEX name ON …``."""
    return definition.split(" INDEX ", 1)[1].split(" ", 1)[0]


def retarget(definition: str, table: str, target: str, suffix: str) -> str:
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


def iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
