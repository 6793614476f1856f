"""Apply the migrations in order, once each, safely from several processes at a time.

They travel with the package: ``outbox/migrations`` in an installed wheel (built from the
repository's ``migrations/`` folder), or that folder itself beside the package in a checkout or a
Functions app's deployment.
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


def migrations_dir() -> Traversable:
    """Where the migrations are: inside the installed package, else beside it (a checkout)."""
    try:
        packaged = resources.files("outbox.migrations")
    except ModuleNotFoundError:
        packaged = None
    if packaged is not None and packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "migrations"


MIGRATIONS_DIR = migrations_dir()


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
    migrations = discover(directory)
    async with store.migration_lock(conn):
        applied = await store.applied_migrations(conn)
        _check_unchanged(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            await store.apply_migration(conn, migration.name, migration.sql, migration.checksum)
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
