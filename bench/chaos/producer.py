"""The adapter's producer: the rows the harness asks for, committed through ``outbox.transaction``.

The harness paces the producer (``PRODUCER_PACING=harness``, its default): a thread writes
``ENQUEUE <n>`` lines to the adapter's stdin, about one every 25 ms. ``read_stdin`` always reads
them, whatever the producer is doing: a pipe nobody reads fills (64 KiB, minutes at 800/s), and
the harness closes stdin before it signals a replica, a close that then blocks behind its own
writer, so the teardown hangs. With ``PRODUCER_PACING=adapter`` the adapter paces itself
(``pace``). Either way ``RateControl`` scales the rows by the harness's control file, which is how
a ``high-load`` phase raises the rate: the harness's own pacer does not read that file.

Owed rows are committed by one connection, up to ``MAX_ROWS_PER_TRANSACTION`` per transaction
(so a backlog built while PostgreSQL was down is caught up quickly); each row's payload carries
the time of its INSERT (``enqueuedAt``), which the receiver turns into the latency. A transaction
that fails is tried again with the same message ids until it commits: when only the answer to its
COMMIT was lost, the retry's first row is a duplicate (``DuplicateMessageError``) and the batch is
counted once. The producer never gives up: a replica that exits on its own aborts the harness's
run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
import uuid
from pathlib import Path

import asyncpg

import outbox

logger = logging.getLogger(__name__)
EVENT_TYPE = "ChaosEvent"
MAX_ROWS_PER_TRANSACTION = 500
PACE_SECONDS = 0.025
CONTROL_READ_SECONDS = 1.0
RETRY_SECONDS = (0.1, 0.2, 0.5, 1.0)
# A transaction that takes longer is abandoned and tried again on a new connection: a connection
# whose server went away without a word would otherwise wait forever.
TRANSACTION_SECONDS = 30.0
LOG_EVERY_SECONDS = 5.0


class Owed:
    """Rows asked for and not yet taken by the producer."""

    def __init__(self) -> None:
        self.rows = 0
        self._ready = asyncio.Event()

    def add(self, rows: int) -> None:
        if rows > 0:
            self.rows += rows
            self._ready.set()

    async def take(self, limit: int) -> int:
        await self._ready.wait()
        taken = min(self.rows, limit)
        self.rows -= taken
        if not self.rows:
            self._ready.clear()
        return taken


class RateControl:
    """Scales asked-for rows by the control file's rate over the base rate (``high-load``)."""

    def __init__(self, base_rate: float, control_file: Path | None) -> None:
        self.base_rate = base_rate
        self.control_file = control_file
        self._rate = base_rate
        self._read_at = 0.0
        self._credit = 0.0

    def rows(self, asked: float) -> int:
        """``asked`` rows at the base rate, as whole rows at the current rate."""
        self._credit += asked * self._factor()
        whole = int(self._credit)
        self._credit -= whole
        return whole

    def _factor(self) -> float:
        now = time.monotonic()
        if self.control_file is not None and now - self._read_at >= CONTROL_READ_SECONDS:
            self._read_at = now
            with contextlib.suppress(OSError, ValueError):  # being rewritten: keep the last rate
                self._rate = float(self.control_file.read_text().strip())
        return self._rate / self.base_rate if self.base_rate else 1.0


async def read_stdin(owed: Owed, control: RateControl) -> None:
    """Reads ``ENQUEUE <n>`` lines until stdin closes (the harness closes it at a stop)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command, _, count = line.decode().partition(" ")
        if command == "ENQUEUE" and count.strip().isdigit():
            owed.add(control.rows(int(count)))


async def pace(owed: Owed, control: RateControl) -> None:
    """The adapter's own pacing: the base rate times the real time elapsed."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(PACE_SECONDS)
        now = time.monotonic()
        owed.add(control.rows(control.base_rate * (now - last)))
        last = now


class Producer:
    """Commits what is owed, one transaction at a time, on a connection it keeps."""

    def __init__(self, database_url: str, payload_bytes: int) -> None:
        self.database_url = database_url
        self.pad = "x" * payload_bytes
        self.committed = 0
        self.stopping = False
        self._conn: asyncpg.Connection | None = None
        self._logged_at = 0.0

    async def run(self, owed: Owed) -> None:
        while not self.stopping:
            rows = await owed.take(MAX_ROWS_PER_TRANSACTION)
            await self._commit([uuid.uuid4() for _ in range(rows)])

    async def _commit(self, ids: list[uuid.UUID]) -> None:
        failures = 0
        while not self.stopping:
            try:
                await self._insert(ids)
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect and retry the batch
                self._log(exc)
                await self._discard()
                await asyncio.sleep(RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)])
                failures += 1
            else:
                self.committed += len(ids)
                return

    async def _insert(self, ids: list[uuid.UUID]) -> None:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.database_url, timeout=5)
        try:
            async with asyncio.timeout(TRANSACTION_SECONDS), outbox.transaction(self._conn) as tx:
                for message_id in ids:
                    payload = {"enqueuedAt": time.time(), "pad": self.pad}
                    await tx.enqueue(EVENT_TYPE, payload, message_id=message_id)
        except outbox.DuplicateMessageError:
            pass  # an earlier try committed the batch; only its COMMIT's answer was lost

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    def _log(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            self._logged_at = now
            logger.warning("producer: %s: %s; retrying the batch", type(exc).__name__, exc)

    async def close(self) -> None:
        await self._discard()
