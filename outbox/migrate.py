"""Apply ``migrations/*.sql`` in order, once each, safely from several processes at a time."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from outbox.errors import MigrationError
from outbox.store import QUERIES, Connection

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


@dataclass(frozen=True, slots=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files, ordered by name (``0001_…``, ``0002_…``)."""
    if not directory.is_dir():
        raise MigrationError(f"migrations folder not found: {directory}")
    return [
        Migration(path.name, path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("*.sql"))
    ]


async def migrate(conn: Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations on ``conn``; returns the names applied (empty when up to date).

    An advisory lock serialises concurrent callers: the second one waits, then finds nothing to do.
    Each migration runs in its own transaction together with its bookkeeping row.
    """
    migrations = discover(directory)
    await conn.execute(QUERIES["lock_migrations"])
    try:
        await conn.execute(QUERIES["create_migrations_table"])
        applied = {
            row["name"]: row["checksum"] for row in await conn.fetch(QUERIES["applied_migrations"])
        }
        _check_unchanged(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(QUERIES["record_migration"], migration.name, migration.checksum)
            logger.info("applied migration %s", migration.name)
            done.append(migration.name)
        return done
    finally:
        await conn.execute(QUERIES["unlock_migrations"])


def _check_unchanged(migrations: list[Migration], applied: dict[str, str]) -> None:
    for migration in migrations:
        recorded = applied.get(migration.name)
        if recorded is not None and recorded != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was edited after it was applied; "
                "add a new migration instead of changing a landed one"
            )
