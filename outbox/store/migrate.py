"""Apply the migrations in order, once each, safely from several processes at a time.

They travel with the package: ``outbox/migrations`` in an installed wheel (built from the
repository's ``migrations/`` folder), or that folder itself beside the package in a checkout or a
Functions app's deployment. The consumer's inbox has a set of its own in ``inbox/`` there, applied
by ``migrate_inbox`` and recorded apart from the relay's.

No migration may hold producers back for long. Every statement waits at most
``LOCK_TIMEOUT_SECONDS`` for a lock: a migration that needs a strong lock on ``outbox_messages``
waits behind any transaction that has read the table (a report, ``pg_dump``), and every producer's
INSERT would wait behind it. When the lock is not granted in time, the migration rolls back (the
producers go on), says which sessions it waits for, and tries again once they have finished (or
after a backoff), for at most ``max_lock_wait`` seconds in all.

A file whose first line is ``-- outbox: no-transaction`` holds one statement that PostgreSQL runs
only outside a transaction, ``CREATE INDEX CONCURRENTLY IF NOT EXISTS …``: it is run alone, then
recorded (docs/internals.md, "Writing a migration"). PostgreSQL builds no index concurrently on a
partitioned table (the partitioned layout) nor drops one so: there the build is made partition by
partition and the drop takes the table's lock for an instant (``schema.IndexBuild``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar

from outbox.core.errors import DatabaseError, MigrationError
from outbox.core.text import escape_controls
from outbox.store import schema
from outbox.store.connection import Connection

logger = logging.getLogger("outbox.migrate")
T = TypeVar("T")


def migrations_dir(subfolder: str | None = None) -> Traversable:
    """Where the migrations are (``subfolder``: the inbox's): inside the installed package, else
    beside it (a checkout)."""
    package = "outbox.migrations" + (f".{subfolder}" if subfolder else "")
    try:
        packaged = resources.files(package)
    except ModuleNotFoundError:
        packaged = None
    if packaged is not None and packaged.is_dir():
        return packaged
    beside = Path(__file__).resolve().parents[2] / "migrations"
    return beside / subfolder if subfolder else beside


MIGRATIONS_DIR = migrations_dir()
INBOX_MIGRATIONS_DIR = migrations_dir("inbox")


# How long one statement of a migration waits for a lock: about as long as a producer's INSERT
# may be held behind it.
LOCK_TIMEOUT_SECONDS = 2.0
# How long, in all, a migration waits for its locks before ``migrate`` gives up
# (``--max-lock-wait``).
DEFAULT_MAX_LOCK_WAIT_SECONDS = 600.0
# Between two tries: at most this long, less as soon as the sessions it waits for have finished.
_BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0)
_POLL_SECONDS = 0.25
NO_TRANSACTION = "-- outbox: no-transaction"
_CONCURRENT_INDEX = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(IF\s+NOT\s+EXISTS\s+)?"
    r"((?:\"[^\"]+\"|\w+)(?:\.(?:\"[^\"]+\"|\w+))?)",
    re.IGNORECASE,
)
# The same build, read whole: for a partitioned table it is built partition by partition.
_INDEX_BUILD = re.compile(
    r"^CREATE\s+(?P<unique>UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+"
    r"(?P<index>\w+)\s+ON\s+(?:ONLY\s+)?(?P<table>\w+)\s+(?P<rest>.+?)\s*;?$",
    re.IGNORECASE | re.DOTALL,
)
_INDEX_DROP = re.compile(
    r"^DROP\s+INDEX\s+CONCURRENTLY\s+IF\s+EXISTS\s+(?P<index>\w+)\s*;?$", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def transactional(self) -> bool:
        """False for a file marked ``-- outbox: no-transaction`` on its first line."""
        return self.sql.partition("\n")[0].strip() != NO_TRANSACTION

    def _body(self) -> str:
        """The statement, without its comment lines."""
        return "\n".join(
            line for line in self.sql.splitlines() if not line.lstrip().startswith("--")
        ).strip()

    def index_build(self) -> schema.IndexBuild | None:
        """A no-transaction file's ``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS name ON
        table …`` (plain names), read into its parts; None for any other statement."""
        match = _INDEX_BUILD.match(self._body())
        if match is None:
            return None
        return schema.IndexBuild(
            match["index"].lower(), match["table"].lower(), match["rest"], bool(match["unique"])
        )

    def index_drop(self) -> str | None:
        """The index a no-transaction ``DROP INDEX CONCURRENTLY IF EXISTS name`` drops."""
        match = _INDEX_DROP.match(self._body())
        return None if match is None else match["index"].lower()

    def concurrent_index(self) -> str | None:
        """The index a no-transaction file builds (``CREATE INDEX CONCURRENTLY IF NOT EXISTS``),
        if it builds one; MigrationError when the file breaks the convention."""
        body = self._body()
        if body.rstrip(";").count(";"):
            raise MigrationError(
                f"migration {self.name} is marked no-transaction and holds more than one "
                "statement: put each such statement in a file of its own"
            )
        match = _CONCURRENT_INDEX.search(body)
        if match is None:
            return None
        if not match.group(1):
            raise MigrationError(
                f"migration {self.name} builds an index CONCURRENTLY without IF NOT EXISTS: "
                "run again after a failure, it must find its work done"
            )
        return match.group(2)


def discover(directory: Traversable | None = None) -> list[Migration]:
    """The migration files, ordered by name (``0001_…``, ``0002_…``)."""
    directory = directory or MIGRATIONS_DIR
    if not directory.is_dir():
        raise MigrationError(f"migrations folder not found: {directory}")
    files = sorted(
        (entry for entry in directory.iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    return [Migration(entry.name, entry.read_text(encoding="utf-8")) for entry in files]


async def migrate(
    conn: Connection,
    directory: Traversable | None = None,
    *,
    max_lock_wait: float = DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> list[str]:
    """Apply pending migrations on ``conn``; returns the names applied (empty when up to date).

    An advisory lock serialises concurrent callers: the second one waits, then finds nothing to do.
    Each migration runs in its own transaction together with its bookkeeping row (a no-transaction
    file: alone, then recorded). A migration whose locks are not granted within
    ``LOCK_TIMEOUT_SECONDS`` rolls back and is tried again; after ``max_lock_wait`` seconds of
    that, MigrationError (the migrations before it stay applied).
    """
    return await _apply(conn, directory or MIGRATIONS_DIR, schema.RELAY_MIGRATIONS, max_lock_wait)


async def migrate_inbox(
    conn: Connection,
    directory: Traversable | None = None,
    *,
    max_lock_wait: float = DEFAULT_MAX_LOCK_WAIT_SECONDS,
) -> list[str]:
    """Apply the consumer inbox's pending migrations (``outbox_inbox``) on ``conn``, as
    ``migrate`` does the relay's, recorded in ``outbox_inbox_migrations`` under a lock of its own.
    """
    return await _apply(
        conn, directory or INBOX_MIGRATIONS_DIR, schema.INBOX_MIGRATIONS, max_lock_wait
    )


async def _apply(
    conn: Connection,
    directory: Traversable,
    bookkeeping: schema.Bookkeeping,
    max_lock_wait: float,
) -> list[str]:
    migrations = discover(directory)
    for migration in migrations:
        if not migration.transactional:
            migration.concurrent_index()  # the convention checked before anything is applied
    lock_timeout = f"{int(LOCK_TIMEOUT_SECONDS * 1000)}ms"
    async with schema.migration_lock(conn, bookkeeping, lock_timeout):
        applied = await schema.applied_migrations(conn, bookkeeping)
        _check_unchanged(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            await _apply_one(conn, migration, bookkeeping, max_lock_wait)
            logger.info("applied migration %s", migration.name)
            done.append(migration.name)
        return done


async def _apply_one(
    conn: Connection,
    migration: Migration,
    bookkeeping: schema.Bookkeeping,
    max_lock_wait: float,
) -> None:
    """Apply ``migration``, trying again while its locks are held by others."""
    index = None if migration.transactional else migration.concurrent_index()

    async def apply(conn: Connection) -> None:
        if migration.transactional:
            await schema.apply_migration(
                conn, migration.name, migration.sql, migration.checksum, bookkeeping
            )
        else:
            await schema.apply_migration_alone(
                conn,
                migration.name,
                migration.sql,
                migration.checksum,
                bookkeeping,
                index,
                build=migration.index_build(),
                drop=migration.index_drop(),
            )

    await retrying(conn, f"migration {migration.name}", max_lock_wait, apply)


async def retrying(
    conn: Connection,
    what: str,
    max_lock_wait: float,
    step: Callable[[Connection], Awaitable[T]],
) -> T:
    """Run ``step`` (one transaction, under the lock timeout) until its locks are granted, waiting
    between tries for the sessions that hold them; ``what`` names it in the warnings and in the
    MigrationError raised once ``max_lock_wait`` seconds have gone by. The lock rule of every
    schema change, numbered migrations and layout changes alike."""
    started = time.monotonic()
    tries = 0
    while True:
        try:
            return await step(conn)
        except DatabaseError as exc:
            if exc.kind != "LockNotAvailableError":
                raise
        await _wait_for_lock(conn, what, started, max_lock_wait, tries)
        tries += 1


async def _wait_for_lock(
    conn: Connection, what: str, started: float, max_lock_wait: float, tries: int
) -> None:
    """Say what ``what`` (``migration 0005_…``, a step of a layout change) waits for, then wait
    until those sessions have finished or a backoff has passed; MigrationError once
    ``max_lock_wait`` seconds have gone by."""
    holders = await schema.lock_holders(conn)
    waited = time.monotonic() - started
    if waited >= max_lock_wait:
        raise MigrationError(
            f"{what} could not take its locks in {max_lock_wait:g} s "
            f"(held by {_describe(holders)}); nothing of it was applied. Run migrate again once "
            "they have finished, or with a longer --max-lock-wait"
        )
    pause = min(_BACKOFF_SECONDS[min(tries, len(_BACKOFF_SECONDS) - 1)], max_lock_wait - waited)
    logger.warning(
        "%s waits for a lock held by %s; trying again within %.1f s "
        "(waited %.0f s of at most %g s)",
        what,
        _describe(holders),
        pause,
        waited,
        max_lock_wait,
    )
    deadline = time.monotonic() + pause
    while time.monotonic() < deadline:
        await asyncio.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        if holders and not await schema.lock_holders_remaining(conn, holders):
            return


def _describe(holders: list[dict[str, object]]) -> str:
    """``pid 123 ('report', in a transaction for 40 s)``, for each session (no query text)."""
    if not holders:
        return "another session"
    return ", ".join(
        f"pid {holder['pid']} ({escape_controls(repr(holder['application_name'] or ''))}, "
        f"in a transaction for {holder['seconds']} s)"
        for holder in holders
    )


def _check_unchanged(migrations: list[Migration], applied: dict[str, str]) -> None:
    for migration in migrations:
        recorded = applied.get(migration.name)
        if recorded is not None and recorded != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was edited after it was applied; "
                "add a new migration instead of changing a landed one"
            )
