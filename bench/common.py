"""What every part of the benchmark shares: the messages, databases, the receiver, settings."""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import psutil

import outbox
from outbox.core.models import LeasedMessage
from outbox.core.settings import Settings
from outbox.store.migrate import migrate
from outbox.transport.publisher import build_body

ROOT = Path(__file__).resolve().parent.parent
EVENT_TYPE = "OrderPlaced"
# A Standard Webhooks secret (the signature costs the relay what it costs in production).
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ENQUEUE_CHUNK = 500


@functools.cache
def bench_server() -> Any:
    """The benchmark's private embedded PostgreSQL (``bench.server``), or None where
    ``OUTBOX_BENCH_ADMIN_DSN`` names a server to use instead (its WAL and CPU figures then
    include whatever else runs there). ``OUTBOX_BENCH_DATA_DIR`` gives the private server a
    folder of its own (two benchmarks at once then do not share one). Call it once before an
    event loop runs."""
    if os.environ.get("OUTBOX_BENCH_ADMIN_DSN"):
        return None
    from bench.server import BenchServer

    folder = os.environ.get("OUTBOX_BENCH_DATA_DIR")
    return BenchServer.start(Path(folder).resolve()) if folder else BenchServer.start()


def admin_dsn() -> str:
    """A superuser DSN for the ``postgres`` database of the server the benchmark uses."""
    server = bench_server()
    return str(server.admin_dsn if server else os.environ["OUTBOX_BENCH_ADMIN_DSN"])


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + database))


def payload(i: int) -> dict[str, Any]:
    """An order event of about 300 bytes of JSON: the same data for every contender."""
    return {
        "orderId": i,
        "customerId": f"cus_{i % 9973:06d}",
        "currency": "EUR",
        "total": f"{(i % 500) + 19.99:.2f}",
        "lines": [
            {"sku": f"SKU-{(i + k) % 1000:04d}", "quantity": 1 + k, "price": f"{4.5 + k:.2f}"}
            for k in range(3)
        ],
        "placedAt": "2026-01-02T03:04:05.123456+00:00",
    }


def body(
    i: int, message_id: uuid.UUID | None = None, data: dict[str, Any] | None = None
) -> tuple[str, bytes]:
    """``(webhook id, body)`` exactly as the relay builds a webhook body for ``payload(i)``
    (or for ``data``)."""
    message_id = message_id or uuid.uuid4()
    text = json.dumps(payload(i) if data is None else data)
    message = LeasedMessage(
        message_id=message_id,
        event_type=EVENT_TYPE,
        payload=text,
        payload_bytes=len(text.encode()),
        attempt=1,
        lease_token=message_id,
        created_at=datetime.now(UTC),
    )
    return str(message_id), build_body(message, text)


def relay_settings(
    database_url: str, hook_url: str, concurrency: int, **overrides: Any
) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "webhooks": {EVENT_TYPE: {"url": hook_url, "secret": SECRET}},
        "concurrency": concurrency,
        "run_budget_seconds": 3600,
    }
    values.update(overrides)
    return Settings.load(**values)


class Database:
    """A fresh database on the benchmark's server, dropped on exit."""

    def __init__(self, prefix: str) -> None:
        self.name = f"bench_{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.url = with_database(admin_dsn(), self.name)

    async def __aenter__(self) -> Database:
        conn = await asyncpg.connect(admin_dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *_: object) -> None:
        conn = await asyncpg.connect(admin_dsn())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await conn.close()

    async def connect(self) -> Any:
        return await asyncpg.connect(self.url)

    async def migrate(self) -> None:
        conn = await self.connect()
        try:
            await migrate(conn)
        finally:
            await conn.close()

    async def backlog(self, messages: int) -> None:
        """Migrate, enqueue ``messages`` through the producer API and settle: a relay's start."""
        await self.migrate()
        conn = await self.connect()
        try:
            await enqueue_outbox(conn, messages)
            await settle(conn)
        finally:
            await conn.close()


async def enqueue_outbox(
    conn: Any, count: int, start: int = 0, event_type: str = EVENT_TYPE
) -> None:
    """``count`` events through the producer API, committed ``ENQUEUE_CHUNK`` at a time."""
    for first in range(start, start + count, ENQUEUE_CHUNK):
        async with conn.transaction():
            for i in range(first, min(first + ENQUEUE_CHUNK, start + count)):
                await outbox.enqueue(conn, event_type, payload(i))


async def settle(conn: Any) -> None:
    """The same starting line for every contender: fresh statistics, nothing dirty to flush."""
    await conn.execute("VACUUM ANALYZE")
    await conn.execute("CHECKPOINT")


async def outbox_counts(conn: Any) -> dict[str, int]:
    rows = await conn.fetch("SELECT status, count(*) AS n FROM outbox_messages GROUP BY status")
    return {row["status"]: row["n"] for row in rows}


async def outbox_wall_seconds(conn: Any) -> float:
    """First lease to last outcome, both as the database recorded them."""
    value = await conn.fetchval(
        "SELECT extract(epoch FROM max(processed_at) - min(processing_started_at))::float8 "
        "FROM outbox_messages"
    )
    return float(value)


# The steady part of a drain: the messages between these fractions of the drain's outcomes.
STEADY_FROM, STEADY_TO = 0.1, 0.9


async def outbox_steady_rate(conn: Any) -> float:
    """Messages per second between the outcome writes of the drain's first 10 % and its last
    10 % (by ``processed_at``): its rate once started and before its last, slowest requests,
    what a process delivers while a backlog lasts, without its start (an endpoint's limit of
    requests in flight growing from 16) and its end (the last batch waiting for its slowest
    answer)."""
    row = await conn.fetchrow(
        "WITH marks AS (SELECT percentile_disc($1::float8) WITHIN GROUP (ORDER BY processed_at)"
        " AS low, percentile_disc($2::float8) WITHIN GROUP (ORDER BY processed_at) AS high"
        " FROM outbox_messages)"
        " SELECT count(*) FILTER (WHERE m.processed_at > low AND m.processed_at <= high) AS n,"
        " extract(epoch FROM high - low)::float8 AS seconds"
        " FROM outbox_messages m, marks GROUP BY low, high",
        STEADY_FROM,
        STEADY_TO,
    )
    return float(row["n"]) / row["seconds"] if row["seconds"] else 0.0


@dataclass
class ReceiverStats:
    requests: int
    distinct: int
    first: float
    last: float
    latencies: list[float]
    max_in_flight: int = 0
    refused: int = 0
    connections: int = 0  # distinct connections requests came in on


class ReceiverProcess:
    """``bench.receiver`` in its own process, on a free port."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> ReceiverProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.receiver"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening "):
            self.process.kill()
            raise RuntimeError(f"receiver did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def reset(self) -> None:
        async with aiohttp.ClientSession() as session, session.post(self.url("/_reset")) as r:
            r.raise_for_status()

    async def stats(self) -> ReceiverStats:
        async with aiohttp.ClientSession() as session, session.get(self.url("/_stats")) as r:
            data = await r.json()
        return ReceiverStats(**data)

    async def requests(self) -> int:
        """Requests counted since the last reset: cheap enough to poll while a run lasts."""
        async with aiohttp.ClientSession() as session, session.get(self.url("/_progress")) as r:
            return int((await r.json())["requests"])

    async def timed(self) -> dict[str, list[Any]]:
        """The timed requests (``/timed/<ms>``): ``ids``, ``arrived``, ``answered``."""
        async with aiohttp.ClientSession() as session, session.get(self.url("/_timed")) as r:
            data: dict[str, list[Any]] = await r.json()
        return data


class CpuMeter:
    """CPU seconds (user + system) used by the receiver and by PostgreSQL between two points.

    PostgreSQL's backends come and go; the postmaster's reaped-children times plus its live
    children count them all.
    """

    def __init__(self, receiver_pid: int) -> None:
        self._receiver = psutil.Process(receiver_pid)
        server = bench_server()
        pid = server.postmaster_pid if server else None
        self._postmaster = psutil.Process(pid) if pid else _postmaster()
        self._start = self._sample()

    def _sample(self) -> tuple[float, float]:
        receiver = self._receiver.cpu_times()
        postgres = 0.0
        if self._postmaster is not None:
            times = self._postmaster.cpu_times()
            postgres = times.user + times.system + times.children_user + times.children_system
            for child in self._postmaster.children():
                try:
                    child_times = child.cpu_times()
                except psutil.Error:
                    continue
                postgres += child_times.user + child_times.system
        return receiver.user + receiver.system, postgres

    def stop(self) -> dict[str, float]:
        receiver, postgres = self._sample()
        return {
            "receiver": round(receiver - self._start[0], 2),
            "postgres": round(postgres - self._start[1], 2),
        }


def _postmaster() -> psutil.Process | None:
    """The local PostgreSQL server's main process, if this user may see it."""
    for process in psutil.process_iter(["name", "ppid"]):
        name = process.info["name"] or ""
        if name.startswith("postgres") and process.info["ppid"] in (0, 1):
            return process
    for process in psutil.process_iter(["name"]):
        if (process.info["name"] or "").startswith("postgres"):
            try:
                parent = process.parent()
            except psutil.Error:
                continue
            if parent is not None and not (parent.name() or "").startswith("postgres"):
                return process
    return None


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for first in range(0, len(items), size):
        yield items[first : first + size]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
