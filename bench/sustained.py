"""Sustained running: a steady offered load for minutes, with autovacuum on and the purge running.

For ``seconds`` (600 in the full run), a producer commits ``rate`` events a second through the
producer API (a transaction every ``TICK`` seconds, its events stamped with ``committedAt`` as it
begins), and one relay (``Relay.open``, in this process) runs as a polling host runs
it: a drain (``execute(until_caught_up=True)``) after another, ``IDLE`` seconds apart when one
found nothing. Every ``purge_every`` seconds the retention purge (``outbox.operations.
purge``, batches of 1,000) deletes the Processed rows; its retention is 0 days (every Processed
row goes), since a run of minutes cannot wait for the default of 7 days: the rows it deletes
are the churn a purge leaves behind for autovacuum, sooner. Autovacuum is switched on for the
run on the benchmark's server (off for every other section), with PostgreSQL's defaults.

Per ``window`` (a minute in the full run): the lease statement's duration as the relay sees
it (p50, p99), commit → webhook received (p50, p99, the receiver's clock against the
producer's, one machine), the table's size (``pg_total_relation_size``) and dead rows at the
window's end, and how many times autovacuum had run on it. Flatness: the last window's p50 and
p99 ÷ the first's, and the largest table size ÷ the smallest. Every message must arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

import outbox
from bench.common import (
    EVENT_TYPE,
    Database,
    ReceiverProcess,
    admin_dsn,
    bench_server,
    log,
    outbox_counts,
    payload,
    percentile,
    relay_settings,
)
from bench.worker import time_leases
from outbox import operations
from outbox.relay.runtime import Relay
from outbox.store.postgres import PostgresStore

TICK = 0.1
IDLE = 0.05
PURGE_BATCH = 1000
TABLE = """
SELECT pg_total_relation_size('outbox_messages') AS bytes, n_live_tup AS live,
       n_dead_tup AS dead, autovacuum_count AS autovacuums
FROM pg_stat_user_tables WHERE relname = 'outbox_messages'
"""


@contextlib.asynccontextmanager
async def autovacuum_on() -> AsyncIterator[str]:
    """Autovacuum on, on the benchmark's own server, for the block (off again after); on a
    server named by ``OUTBOX_BENCH_ADMIN_DSN``, its setting as it is."""
    conn = await asyncpg.connect(admin_dsn())
    try:
        if bench_server() is None:
            yield str(await conn.fetchval("SHOW autovacuum"))
            return
        await conn.execute("ALTER SYSTEM SET autovacuum = on")
        await conn.execute("SELECT pg_reload_conf()")
        try:
            yield "on"
        finally:
            await conn.execute("ALTER SYSTEM SET autovacuum = off")
            await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def produce(pool: Any, rate: float, seconds: float) -> int:
    """Commit ``rate`` events a second for ``seconds``, a transaction every ``TICK``."""
    loop = asyncio.get_running_loop()
    started, sent = loop.time(), 0
    while (elapsed := loop.time() - started) < seconds:
        due = int(min(elapsed + TICK, seconds) * rate)
        async with pool.acquire() as conn, conn.transaction():
            stamp = time.time()
            for i in range(sent, due):
                await outbox.enqueue(conn, EVENT_TYPE, {**payload(i), "committedAt": stamp})
        sent = due
        await asyncio.sleep(max(0.0, started + elapsed + TICK - loop.time()))
    return sent


async def relay_loop(relay: Relay, stop: asyncio.Event) -> int:
    processed = 0
    while not stop.is_set():
        summary = await relay.processor.execute(until_caught_up=True)
        if summary.error:
            raise RuntimeError(f"relay run failed: {summary.as_dict()}")
        processed += summary.processed
        if not summary.processed:
            await asyncio.sleep(IDLE)
    return processed


async def purge_loop(pool: Any, every: float, stop: asyncio.Event) -> int:
    deleted = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        report = await operations.purge(
            pool, retention_days=0, failed_retention_days=None, batch_size=PURGE_BATCH
        )
        deleted += report.processed_deleted
    return deleted


class Windows:
    """The figures of each window, read at its end."""

    def __init__(self, receiver: ReceiverProcess, leases: list[float]) -> None:
        self.receiver, self.leases = receiver, leases
        self.rows: list[dict[str, Any]] = []
        self._latencies_seen = 0
        self._leases_seen = 0

    async def close_window(self, pool: Any, index: int) -> None:
        stats = await self.receiver.stats()
        latencies = stats.latencies[self._latencies_seen :]
        self._latencies_seen = len(stats.latencies)
        leases = self.leases[self._leases_seen :]
        self._leases_seen = len(leases) + self._leases_seen
        table = await pool.fetchrow(TABLE)
        self.rows.append(
            {
                "window": index,
                "delivered": len(latencies),
                "delivery_p50_ms": _ms(percentile(latencies, 50)),
                "delivery_p99_ms": _ms(percentile(latencies, 99)),
                "leases": len(leases),
                "lease_p50_ms": _ms(percentile(leases, 50)),
                "lease_p99_ms": _ms(percentile(leases, 99)),
                "table_mb": round(table["bytes"] / 2**20, 2),
                "live_rows": table["live"],
                "dead_rows": table["dead"],
                "autovacuums": table["autovacuums"],
            }
        )
        log(f"sustained window {index}: {self.rows[-1]}")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


async def run_windows(windows: Windows, pool: Any, seconds: float, window: float) -> None:
    started = time.monotonic()
    for index in range(1, int(seconds // window) + 1):
        await asyncio.sleep(max(0.0, started + index * window - time.monotonic()))
        await windows.close_window(pool, index)


async def measure(
    receiver: ReceiverProcess,
    *,
    seconds: float,
    rate: float,
    window: float,
    purge_every: float,
    concurrency: int,
) -> dict[str, Any]:
    await receiver.reset()
    leases: list[float] = []
    lease_batch = PostgresStore.lease_batch
    time_leases(leases)
    try:
        result = await _measure(receiver, leases, seconds, rate, window, purge_every, concurrency)
    finally:
        PostgresStore.lease_batch = lease_batch  # type: ignore[method-assign]
    return result


async def _measure(
    receiver: ReceiverProcess,
    leases: list[float],
    seconds: float,
    rate: float,
    window: float,
    purge_every: float,
    concurrency: int,
) -> dict[str, Any]:
    stop = asyncio.Event()
    async with autovacuum_on() as autovacuum, Database("sustained") as db:
        await db.migrate()
        settings = relay_settings(db.url, receiver.url("/latency"), concurrency)
        pool = await asyncpg.create_pool(db.url, min_size=2, max_size=4)
        try:
            async with await Relay.open(settings) as relay:
                windows = Windows(receiver, leases)
                relaying = asyncio.create_task(relay_loop(relay, stop))
                purging = asyncio.create_task(purge_loop(pool, purge_every, stop))
                measuring = asyncio.create_task(run_windows(windows, pool, seconds, window))
                sent = await produce(pool, rate, seconds)
                await measuring
                await _wait_for(receiver, sent, deadline=60.0)
                stop.set()
                await relaying
                purged = await purging
            counts = await outbox_counts(pool)
        finally:
            await pool.close()
    stats = await receiver.stats()
    if stats.distinct != sent:
        raise AssertionError(f"sustained: {stats.distinct} of {sent} messages arrived")
    return summarise(windows.rows, sent, purged, counts, autovacuum, rate, seconds, window)


async def _wait_for(receiver: ReceiverProcess, messages: int, deadline: float) -> None:
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        if (await receiver.stats()).distinct >= messages:
            return
        await asyncio.sleep(0.2)


def summarise(
    rows: list[dict[str, Any]],
    sent: int,
    purged: int,
    counts: dict[str, int],
    autovacuum: str,
    rate: float,
    seconds: float,
    window: float,
) -> dict[str, Any]:
    first, last = rows[0], rows[-1]
    sizes = [r["table_mb"] for r in rows]
    return {
        "seconds": seconds,
        "rate": rate,
        "window_seconds": window,
        "messages": sent,
        "purged": purged,
        "rows_left": counts,
        "autovacuum": autovacuum,
        "windows": rows,
        # Flatness: the last window against the first, and the table's largest against smallest.
        "flatness": {
            "delivery_p50_last_vs_first": _ratio(last["delivery_p50_ms"], first["delivery_p50_ms"]),
            "delivery_p99_last_vs_first": _ratio(last["delivery_p99_ms"], first["delivery_p99_ms"]),
            "lease_p50_last_vs_first": _ratio(last["lease_p50_ms"], first["lease_p50_ms"]),
            "lease_p99_last_vs_first": _ratio(last["lease_p99_ms"], first["lease_p99_ms"]),
            "table_largest_vs_smallest": _ratio(max(sizes), min(sizes)),
        },
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")
