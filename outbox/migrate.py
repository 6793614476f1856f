"""Apply the migrations in order, once each, safely from several processes at a time.

They travel with the package: ``outbox/migrations`` in an installed wheel (built from the
repository's ``migrations/`` folder), or that folder itself beside the package in a checkout or a
Functions app's deployment. The consumer's inbox has a set of its own in ``inbox/`` there, applied
by ``migrate_inbox`` and recorded apart from the relay's.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from outbox import store
from outbox.errors import MigrationError

logger = logging.getLogger(__name__)


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
    beside = Path(__file__).resolve().parent.parent / "migrations"
    return beside / subfolder if subfolder else beside


MIGRATIONS_DIR = migrations_dir()
INBOX_MIGRATIONS_DIR = migrations_dir("inbox")


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


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


async def migrate(conn: store.Connection, directory: Traversable | None = None) -> list[str]:
    """Apply pending migrations on ``conn``; returns the names applied (empty when up to date).

    An advisory lock serialises concurrent callers: the second one waits, then finds nothing to do.
    Each migration runs in its own transaction together with its bookkeeping row.
    """
    return await _apply(conn, directory or MIGRATIONS_DIR, store.RELAY_MIGRATIONS)


async def migrate_inbox(conn: store.Connection, directory: Traversable | None = None) -> list[str]:
    """Apply the consumer inbox's pending migrations (``outbox_inbox``) on ``conn``, as
    ``migrate`` does the relay's, recorded in ``outbox_inbox_migrations`` under a lock of its own.
    """
    return await _apply(conn, directory or INBOX_MIGRATIONS_DIR, store.INBOX_MIGRATIONS)


async def _apply(
    conn: store.Connection, directory: Traversable, bookkeeping: store.Bookkeeping
) -> list[str]:
    migrations = discover(directory)
    async with store.migration_lock(conn, bookkeeping):
        applied = await store.applied_migrations(conn, bookkeeping)
        _check_unchanged(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            await store.apply_migration(
                conn, migration.name, migration.sql, migration.checksum, bookkeeping
            )
            logger.info("applied migration %s", migration.name)
            done.append(migration.name)
        return done


def _check_unchanged(migrations: list[Migration], applied: dict[str, str]) -> None:
    for migration in migrations:
        recorded = applied.get(migration.name)
        if recorded is not None and recorded != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was edited after it was applied; "
                "add a new migration instead of changing a landed one"
            )
