"""A minimal log-tailing relay: a prototype to measure, not production code (docs/log-tailing.md).

It reads the outbox rows committed transactions inserted from a logical replication slot
(``pgoutput``, a publication of ``outbox_messages`` with ``publish = 'insert'``), in commit order,
POSTs each one as the relay would (the same body, Standard Webhooks signature and HTTP session
settings: ``outbox.transport.publisher``), records the outcomes in batches, and only after a
batch has committed confirms the slot's position up to the end of the last transaction whose
every message is recorded. A crash before that confirmation means the transaction is read and
delivered again: at least once, as the polling relay.

Two sources of the same changes:

- ``stream``: the replication protocol (``START_REPLICATION … LOGICAL``) over psycopg2's
  ``LogicalReplicationConnection``, the one Python driver here that speaks it (asyncpg does not,
  psycopg 3 only starts it); read in the event loop without a thread, confirmed by standby status
  updates.
- ``sql``: ``pg_logical_slot_peek_binary_changes`` through asyncpg, the relay's own driver, and
  ``pg_replication_slot_advance`` once a peek's transactions are recorded. A peek always starts
  at the slot's confirmed position, so nothing new is read until the last one is confirmed.

Two places for the outcome:

- ``outcomes``: one row per attempt in ``outbox_logical_outcomes`` (an insert, no update): the
  outbox row is never written again.
- ``rows``: as the polling relay's outcome write without its lease: the outbox row set
  ``Processed`` and its attempt added to ``outbox_attempts``, so ``status``, the console, ``show``
  and the purge see what they see today.

Messages with the same ordering key go one at a time, in commit order; the others
``concurrency`` at a time. A non-2xx answer or a failure is recorded (``Pending`` with its error)
and left to the polling relay's retries: this prototype retries nothing (the benchmark's receiver
answers 204).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import asyncpg

from bench.logical.pgoutput import Decoder, Transaction
from outbox.core.models import LeasedMessage
from outbox.core.settings import Settings
from outbox.core.signing import Signer
from outbox.transport.publisher import build_body, build_headers, make_session

SLOT = "outbox_logical"
PUBLICATION = "outbox_logical"
TABLE = "outbox_messages"
# The columns the publication sends: what a webhook needs, nothing the relay writes later.
COLUMNS = "outbox_message_id, event_type, payload, ordering_key, created_at"
# Without new changes, the sql source peeks again after this long.
SQL_IDLE_SECONDS = 0.01
# A batch of outcomes waits at most this long for more before it is written.
RECORD_DELAY_SECONDS = 0.005

SETUP = f"""
CREATE TABLE IF NOT EXISTS outbox_logical_outcomes (
    outbox_message_id uuid        NOT NULL,
    attempt_number    integer     NOT NULL,
    outcome           text        NOT NULL,
    http_status       integer,
    started_at        timestamptz NOT NULL,
    duration_ms       integer     NOT NULL,
    error             text,
    recorded_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (outbox_message_id, attempt_number)
);
CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE} ({COLUMNS}) WITH (publish = 'insert');
"""
CREATE_SLOT = "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"

RECORD_OUTCOMES = """
INSERT INTO outbox_logical_outcomes
    (outbox_message_id, attempt_number, outcome, http_status, started_at, duration_ms, error)
SELECT id, 1, CASE WHEN status BETWEEN 200 AND 299 THEN 'Processed' ELSE 'Pending' END,
       status, to_timestamp(started), duration_ms, error
FROM unnest($1::uuid[], $2::int[], $3::float8[], $4::int[], $5::text[])
     AS a(id, status, started, duration_ms, error)
"""
# The polling relay's record_delivered without the lease's fence: the row was never leased.
# A change is sent once its commit record is flushed, which can be before the committed row is
# visible to other sessions: the ids whose row was not found yet are returned, to write again.
RECORD_ROWS = """
WITH a AS (
    SELECT *
    FROM unnest($1::uuid[], $2::int[], $3::float8[], $4::int[], $5::text[])
         AS a(id, status, started, duration_ms, error)
),
updated AS (
    UPDATE outbox_messages AS m
    SET status = CASE WHEN a.status BETWEEN 200 AND 299 THEN 'Processed' ELSE 'Pending' END,
        processed_at = CASE WHEN a.status BETWEEN 200 AND 299 THEN now() END,
        next_attempt_at = CASE WHEN a.status BETWEEN 200 AND 299 THEN m.next_attempt_at
                               ELSE now() + interval '10 seconds' END,
        attempt_count = 1,
        last_error = a.error
    FROM a
    WHERE m.outbox_message_id = a.id AND m.status = 'Pending' AND m.attempt_count = 0
    RETURNING m.outbox_message_id
),
history AS (
    INSERT INTO outbox_attempts
        (outbox_message_id, attempt_number, lease_token, started_at, finished_at, duration_ms,
         outcome, applied, http_status, endpoint, error)
    SELECT a.id, 1, a.id, to_timestamp(a.started),
           to_timestamp(a.started + a.duration_ms / 1000.0), a.duration_ms,
           CASE WHEN a.status BETWEEN 200 AND 299 THEN 'Processed' ELSE 'Pending' END,
           true, a.status, NULL, a.error
    FROM a JOIN updated AS u ON u.outbox_message_id = a.id
)
SELECT ARRAY(SELECT a.id FROM a
             WHERE a.id NOT IN (SELECT outbox_message_id FROM updated)) AS missing
"""
INVISIBLE_RETRY_SECONDS = 0.002
RECORDS = {"outcomes": RECORD_OUTCOMES, "rows": RECORD_ROWS}


async def prepare(conn: Any) -> None:
    """The outcomes table, the publication and the slot, on a migrated database. The slot is made
    after the publication, so it sees every insert from then on."""
    await conn.execute(SETUP)
    await conn.execute(CREATE_SLOT, SLOT)


async def drop_slot(conn: Any) -> None:
    """The slot, once nothing reads it (a slot keeps its database from being dropped)."""
    for _ in range(100):
        active = await conn.fetchval(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1", SLOT
        )
        if active is None:
            return
        if not active:
            await conn.execute("SELECT pg_drop_replication_slot($1)", SLOT)
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"slot {SLOT} still in use")


@dataclass
class Txn:
    """A transaction read from the slot, until every message of it is recorded."""

    end_lsn: int
    pending: int


@dataclass
class Attempt:
    message: LeasedMessage
    txn: Txn
    status: int = 0
    started: float = 0.0
    duration_ms: int = 0
    error: str | None = None


@dataclass
class Counters:
    received: int = 0
    delivered: int = 0
    recorded: int = 0
    batches: int = 0
    invisible: int = 0  # outcome writes that found their row not yet visible (rows only)
    transactions: int = 0
    first_received: float = 0.0
    last_recorded: float = 0.0
    record_seconds: list[float] = field(default_factory=list)


def message_of(row: dict[str, str | None]) -> LeasedMessage:
    """A row as the poller's lease would return it (the id kept as text: it is only printed)."""
    payload = row["payload"] or "null"
    message_id = row["outbox_message_id"]
    return LeasedMessage(
        message_id=message_id,  # type: ignore[arg-type]
        event_type=row["event_type"] or "",
        payload=payload,
        payload_bytes=len(payload),
        attempt=1,
        lease_token=message_id,  # type: ignore[arg-type]
        created_at=datetime.fromisoformat(row["created_at"] or ""),
        ordering_key=row["ordering_key"],
    )


class StreamSource:
    """The slot over the replication protocol (psycopg2), read when its socket is readable."""

    def __init__(self, dsn: str, limit: int) -> None:
        self.dsn = dsn
        self.limit = limit  # messages read ahead at most, then the socket is left unread
        self.queue: deque[Transaction] = deque()
        self.buffered = 0
        self.ready = asyncio.Event()
        self.decoder = Decoder(TABLE)
        self.paused = False
        self.confirmed = 0
        self._sent = 0.0
        self.error: BaseException | None = None

    async def start(self) -> None:
        import psycopg2
        import psycopg2.extras

        self.conn = psycopg2.connect(
            self.dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection
        )
        self.cursor = self.conn.cursor()
        self.cursor.start_replication(
            slot_name=SLOT,
            decode=False,
            options={"proto_version": "1", "publication_names": PUBLICATION},
            status_interval=1,
        )
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(self.conn.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            while self.buffered < self.limit:
                message = self.cursor.read_message()
                if message is None:
                    return
                txn = self.decoder.feed(message.payload)
                if txn is not None:
                    self.queue.append(txn)
                    self.buffered += len(txn.rows)
                    self.ready.set()
            self.paused = True
            self.loop.remove_reader(self.conn.fileno())
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            self.error = exc
            self.ready.set()

    async def transactions(self) -> AsyncIterator[Transaction]:
        while True:
            while not self.queue:
                if self.error is not None:
                    raise self.error
                self.ready.clear()
                await self.ready.wait()
            txn = self.queue.popleft()
            self.buffered -= len(txn.rows)
            if self.paused and self.buffered < self.limit // 2:
                self.paused = False
                self.loop.add_reader(self.conn.fileno(), self._readable)
                self._readable()
            yield txn

    def confirm(self, lsn: int, *, idle: bool = False, force: bool = False) -> None:
        """Tell the server everything up to ``lsn`` is done with; when nothing is in flight,
        everything it has sent (its keepalives' position), so an idle slot does not lag."""
        if idle and not self.queue and self.decoder.idle:
            # A logical walsender's wal_end is what it has decoded and sent (its XLogData and
            # keepalives carry that), so with nothing read and not done, all of it is done.
            lsn = max(lsn, self.cursor.wal_end)
        now = time.monotonic()
        if lsn > self.confirmed or force or now - self._sent > 1.0:
            self.confirmed = max(self.confirmed, lsn)
            self.cursor.send_feedback(
                write_lsn=self.confirmed, flush_lsn=self.confirmed, force=True
            )
            self._sent = now

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.conn.fileno())
        self.conn.close()


class SqlSource:
    """The slot through the SQL functions over asyncpg: peek, then advance once confirmed."""

    PEEK = (
        "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2,"
        " 'proto_version', '1', 'publication_names', $3)"
    )

    def __init__(self, dsn: str, limit: int) -> None:
        self.dsn = dsn
        self.limit = limit
        self.confirmed = 0
        self.peeks = 0
        self._last_end = 0
        self._advanced = asyncio.Event()
        self._advance_lock = asyncio.Lock()
        self.error: BaseException | None = None

    async def start(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        self.advancer = await asyncpg.connect(self.dsn)

    async def transactions(self) -> AsyncIterator[Transaction]:
        while True:
            rows = await self.conn.fetch(self.PEEK, SLOT, self.limit, PUBLICATION)
            self.peeks += 1
            decoder = Decoder(TABLE)  # each peek sends the relation again
            found = [t for t in (decoder.feed(r["data"]) for r in rows) if t is not None]
            if not found:
                await asyncio.sleep(SQL_IDLE_SECONDS)
                continue
            self._last_end = found[-1].end_lsn
            self._advanced.clear()
            for txn in found:
                yield txn
            # A peek starts at the confirmed position: wait until these are confirmed.
            while self.confirmed < self._last_end:
                await self._advanced.wait()
                self._advanced.clear()
                if self.error is not None:
                    raise self.error

    def confirm(self, lsn: int, *, idle: bool = False, force: bool = False) -> None:
        if lsn > self.confirmed:
            asyncio.get_running_loop().create_task(self._advance(lsn))

    async def _advance(self, lsn: int) -> None:
        async with self._advance_lock:
            if lsn <= self.confirmed:
                return
            try:
                # asyncpg takes a pg_lsn as its integer.
                await self.advancer.execute(
                    "SELECT pg_replication_slot_advance($1, $2::pg_lsn)", SLOT, lsn
                )
            except Exception as exc:  # noqa: BLE001 - raised where the changes are read
                self.error = exc
            else:
                self.confirmed = lsn
            self._advanced.set()

    async def close(self) -> None:
        async with self._advance_lock:
            pass
        await self.conn.close()
        await self.advancer.close()


class Tailer:
    """Reads the slot, delivers, records in batches, confirms."""

    def __init__(
        self,
        settings: Settings,
        source: StreamSource | SqlSource,
        record: str,
        *,
        batch_size: int = 100,
    ) -> None:
        self.settings = settings
        self.source = source
        self.record_statement = RECORDS[record]
        self.batch_size = batch_size
        self.concurrency = settings.concurrency
        [self.endpoint] = next(iter(settings.endpoints.values()))
        self.signer = Signer(self.endpoint.signing_keys)
        self.counters = Counters()
        self.ready: deque[Attempt] = deque()
        self.work = asyncio.Event()
        self.keys: dict[str, deque[Attempt]] = {}
        self.done: list[Attempt] = []
        self.txns: deque[Txn] = deque()
        # At most this many messages read and not yet recorded: the relay's own bound (two
        # batches in flight at 16 requests), so both hold as much in memory.
        self.window = asyncio.Semaphore(max(2, -(-4 * self.concurrency // batch_size)) * batch_size)
        self.in_flight = 0
        self.flushing: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()
        self.error: BaseException | None = None
        self.started = asyncio.Event()  # the source is reading

    async def run(self, until: Callable[[Counters], bool] | None = None) -> Counters:
        """Until ``stop()``, or once ``until(counters)`` holds after a recorded batch."""
        self.until = until
        self.pool = await asyncpg.create_pool(self.source.dsn, min_size=1, max_size=2)
        self.session: aiohttp.ClientSession = make_session(self.settings)
        await self.source.start()
        self.started.set()
        reader = asyncio.create_task(self._read())
        senders = [asyncio.create_task(self._send()) for _ in range(self.concurrency)]
        ticker = asyncio.create_task(self._tick())
        try:
            await self.stopping.wait()
        finally:
            ticker.cancel()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await self._settle()
            for sender in senders:
                sender.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            self.source.confirm(self._confirmable(), idle=not self.txns, force=True)
            await self.source.close()
            await self.session.close()
            await self.pool.close()
        if self.error is not None:
            raise self.error
        return self.counters

    def stop(self) -> None:
        self.stopping.set()

    async def _tick(self) -> None:
        """Once a second with nothing read and not done, confirm what the server has sent:
        other tables' writes (the outcomes' own) are decoded and skipped, and the slot need not
        keep them."""
        while True:
            await asyncio.sleep(1.0)
            if not self.txns:
                self.source.confirm(0, idle=True)

    async def _read(self) -> None:
        try:
            async for transaction in self.source.transactions():
                await self._take(transaction)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - ends the run with it
            self.error = exc
            self.stopping.set()

    async def _take(self, transaction: Transaction) -> None:
        counters = self.counters
        counters.transactions += 1
        txn = Txn(transaction.end_lsn, len(transaction.rows))
        self.txns.append(txn)
        if not counters.first_received:
            counters.first_received = time.monotonic()
        for row in transaction.rows:
            await self.window.acquire()
            counters.received += 1
            attempt = Attempt(message_of(row), txn)
            key = attempt.message.ordering_key
            if key is None:
                self.ready.append(attempt)
            elif key in self.keys:
                self.keys[key].append(attempt)  # after the one of its key in flight
                continue
            else:
                self.keys[key] = deque()
                self.ready.append(attempt)
            self.work.set()
        if not transaction.rows:
            self._advance()

    async def _send(self) -> None:
        while True:
            while not self.ready:
                self.work.clear()
                await self.work.wait()
            attempt = self.ready.popleft()
            self.in_flight += 1
            try:
                await self._post(attempt)
            finally:
                self.in_flight -= 1
            self.counters.delivered += 1
            key = attempt.message.ordering_key
            if key is not None:
                waiting = self.keys[key]
                if waiting:
                    self.ready.append(waiting.popleft())
                    self.work.set()
                else:
                    del self.keys[key]
            self.done.append(attempt)
            if self.flushing is None:
                self.flushing = asyncio.create_task(self._flush())

    async def _post(self, attempt: Attempt) -> None:
        message = attempt.message
        assert message.payload is not None
        body = build_body(message, message.payload)
        headers = build_headers(self.signer, str(message.message_id), body)
        attempt.started = time.time()
        clock = time.monotonic()
        try:
            async with self.session.post(self.endpoint.url, data=body, headers=headers) as r:
                await r.read()
                attempt.status = r.status
                if r.status >= 300:
                    attempt.error = f"HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            attempt.error = f"{type(exc).__name__}: {exc}"[:500]
        attempt.duration_ms = round((time.monotonic() - clock) * 1000)

    async def _flush(self) -> None:
        """Write what is done, a batch at a time, while deliveries go on."""
        try:
            while self.done:
                if len(self.done) < self.batch_size and (self.in_flight or self.ready):
                    await asyncio.sleep(RECORD_DELAY_SECONDS)
                batch, self.done = self.done[: self.batch_size], self.done[self.batch_size :]
                await self._record(batch)
        except BaseException as exc:  # noqa: BLE001 - ends the run with it
            self.error = exc
            self.stopping.set()
        finally:
            self.flushing = None

    async def _record(self, batch: list[Attempt]) -> None:
        started = time.perf_counter()
        left = batch
        deadline = time.monotonic() + 10
        while left:
            missing = await self.pool.fetchval(
                self.record_statement,
                [a.message.message_id for a in left],
                [a.status for a in left],
                [a.started for a in left],
                [a.duration_ms for a in left],
                [a.error for a in left],
            )
            if not missing:
                break
            # Not visible yet (RECORD_ROWS): written again in a moment.
            if time.monotonic() > deadline:
                raise RuntimeError(f"outbox rows never became visible: {missing[:3]}")
            self.counters.invisible += len(missing)
            unseen = {str(m) for m in missing}
            left = [a for a in left if str(a.message.message_id) in unseen]
            await asyncio.sleep(INVISIBLE_RETRY_SECONDS)
        counters = self.counters
        counters.record_seconds.append(time.perf_counter() - started)
        counters.batches += 1
        counters.recorded += len(batch)
        counters.last_recorded = time.monotonic()
        for attempt in batch:
            attempt.txn.pending -= 1
            self.window.release()
        self._advance()
        if self.until is not None and self.until(counters):
            self.stopping.set()

    def _confirmable(self) -> int:
        """The end of the last transaction before the first one with a message unrecorded."""
        lsn = 0
        while self.txns and self.txns[0].pending == 0:
            lsn = self.txns.popleft().end_lsn
        return lsn

    def _advance(self) -> None:
        lsn = self._confirmable()
        if lsn or not self.txns:
            self.source.confirm(lsn, idle=not self.txns)

    async def _settle(self) -> None:
        """Let what was read be delivered and recorded (a stop loses nothing it holds)."""
        deadline = time.monotonic() + 30
        while (self.ready or self.in_flight or self.done or self.flushing) and (
            time.monotonic() < deadline
        ):
            if self.done and self.flushing is None:
                self.flushing = asyncio.create_task(self._flush())
            await asyncio.sleep(0.01)


def make_source(kind: str, dsn: str, limit: int) -> StreamSource | SqlSource:
    return StreamSource(dsn, limit) if kind == "stream" else SqlSource(dsn, limit)
