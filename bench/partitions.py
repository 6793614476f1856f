"""The partitioned outbox (``python -m outbox migrate --partitioned``) against the plain table:
both layouts in the same run, each figure a ratio partitioned ÷ plain taken per round, reported as
the median of the rounds' ratios with their spread.

- retention: three simulated days of traffic (``per_day`` Processed messages a day, each with its
  attempt, ``processed_at`` 50 ms after ``created_at``; ``live`` Pending and ``live`` Failed
  messages in the oldest day, with their attempts), filled in one ``INSERT … SELECT`` a day, then
  ``VACUUM ANALYZE`` and a ``CHECKPOINT``. The oldest day is one whole UTC day (one partition);
  the two newer days end at the fill's moment and begin an hour after its moment two days ago,
  so that ``operations.purge(retention_days=2)`` removes exactly the oldest day's Processed rows
  on either layout. The purge runs while a producer commits one message a transaction at
  ``rate`` per second and a relay-like loop leases (``PostgresStore.lease_batch``) every 20 ms and
  records the outcomes (``PostgresStore.record_delivered``), both timed, as they were for ``quiet``
  seconds before it. Measured: the purge's wall time; its WAL (its own backend's, from
  ``pg_stat_get_backend_wal``, PostgreSQL 18; the server's over the purge otherwise, which
  includes the load's); blocks read, written and extended from its start to the end of a
  CHECKPOINT after it (``pg_stat_io``, the whole server's, so the load's too; PostgreSQL 15
  gives only the writes, from ``pg_stat_bgwriter``); the tables' and indexes' size after it and
  after a VACUUM (its time and WAL too); lease and commit latency before and during it. Checked:
  every live row and its history survive, every row of the newer days and of the producer is
  there, no Processed row of the oldest day is.
- hotpath: ``messages`` enqueued through the producer API (500 a transaction) and drained by
  one relay process to the instant receiver (``bench.dbcost``'s worker): enqueue WAL and time
  per message, drain WAL and PostgreSQL CPU per message, drain rate, the relay's lease times.
- bloat: a steady stream at ``rate`` messages per second for ``seconds`` seconds, enqueued in
  one transaction per 50 ms and leased every 20 ms (and recorded) as above, ``VACUUM (ANALYZE)``
  of the table's leaves every ``vacuum_every`` seconds (the benchmark's server runs no
  autovacuum: this stands for it); once without, once with a transaction held open throughout
  (``BEGIN; SELECT txid_current()`` on a connection of its own), which holds back what vacuum may
  remove.
  Lease p50/p99 over the run and over its last quarter; dead tuples left and the due indexes'
  size at the end. Checked: every message enqueued was delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import outbox
from bench.common import (
    EVENT_TYPE,
    CpuMeter,
    Database,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    outbox_counts,
    payload,
    percentile,
    settle,
)
from bench.dbcost import run as run_worker
from bench.dbcost import worker_command
from bench.server import wal_bytes, wal_lsn
from outbox import operations
from outbox.store import partitions as layout_ops
from outbox.store.contract import SentAttempt
from outbox.store.postgres import PostgresStore

LAYOUTS = ("plain", "partitioned")
PARTS = ("retention", "hotpath", "bloat")
HOTPATH_TARGET = 1.1  # at most: partitioned ÷ plain, per message
# The newer days begin this long after the fill's moment two days ago: the purge must start
# within it, so that it removes the oldest day and nothing of the next.
MARGIN = timedelta(hours=1)
LEASE_EVERY = 0.02
LEASE_BATCH = 100

SMOKE = {
    "partitions_parts": ",".join(PARTS),
    "retention_per_day": 300,
    "retention_live": 3,
    "retention_rate": 50.0,
    "retention_quiet": 0.5,
    "retention_runs": 1,
    "hotpath_messages": 200,
    "hotpath_runs": 1,
    "bloat_rate": 100.0,
    "bloat_seconds": 1.0,
    "bloat_vacuum_every": 0.5,
    "bloat_runs": 1,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--partitions-parts", default=",".join(PARTS), help=f"of: {', '.join(PARTS)}")
    add("--retention-per-day", type=int, default=2_000_000, help="messages per simulated day")
    add("--retention-live", type=int, default=50, help="Pending, and Failed, in the oldest day")
    add("--retention-rate", type=float, default=200.0, help="producer commits/s during purge")
    add("--retention-quiet", type=float, default=10.0, help="seconds of load before the purge")
    add("--retention-runs", type=int, default=1, help="rounds of the retention figure")
    add("--hotpath-messages", type=int, default=20_000, help="per hot-path run")
    add("--hotpath-runs", type=int, default=3)
    add("--hotpath-past-days", type=int, default=7, help="days of partitions kept behind today")
    add(
        "--hotpath-interval",
        choices=tuple(layout_ops.INTERVALS),
        default=layout_ops.DEFAULT_INTERVAL,
        help="partition size",
    )
    add("--bloat-rate", type=float, default=1000.0, help="messages per second, bloat figure")
    add("--bloat-seconds", type=float, default=600.0, help="length of each bloat run")
    add("--bloat-vacuum-every", type=float, default=10.0, help="seconds between VACUUMs")
    add("--bloat-runs", type=int, default=1)


async def measure(receiver: ReceiverProcess, args: argparse.Namespace) -> dict[str, Any]:
    parts = {part for part in args.partitions_parts.split(",") if part}
    results: dict[str, Any] = {}
    if "retention" in parts:
        results["retention"] = await measure_retention(
            per_day=args.retention_per_day,
            live=args.retention_live,
            rate=args.retention_rate,
            quiet=args.retention_quiet,
            runs=args.retention_runs,
        )
    if "hotpath" in parts:
        results["hotpath"] = await measure_hotpath(
            receiver,
            messages=args.hotpath_messages,
            runs=args.hotpath_runs,
            past_days=args.hotpath_past_days,
            interval=args.hotpath_interval,
        )
    if "bloat" in parts:
        results["bloat"] = await measure_bloat(
            rate=args.bloat_rate,
            seconds=args.bloat_seconds,
            vacuum_every=args.bloat_vacuum_every,
            runs=args.bloat_runs,
        )
    return results


# ---------------------------------------------------------------------------------------------
# Shared


async def prepare(
    db: Database,
    conn: Any,
    layout: str,
    past_days: int = 0,
    interval: str = layout_ops.DEFAULT_INTERVAL,
) -> None:
    """The schema as migrated, converted to the partitioned layout (partitions of ``interval``)
    where asked, with the partitions of ``past_days`` days behind today (as retention keeps
    them) made too."""
    await db.migrate()
    if layout == "partitioned":
        await layout_ops.convert(conn, interval=interval)
        if past_days:
            now = await conn.fetchval("SELECT now()")
            await layout_ops.ensure_partitions(conn, now - timedelta(days=past_days), now)


def ratio_summary(values: list[float]) -> dict[str, float]:
    return {"median": round(median(values), 3), "low": min(values), "high": max(values)}


def per_round(rounds: list[dict[str, Any]], key: Callable[[dict[str, Any]], float]) -> list[float]:
    """partitioned ÷ plain of ``key`` in each round."""
    return [
        round(key(r["partitioned"]) / key(r["plain"]), 3) if key(r["plain"]) else float("nan")
        for r in rounds
    ]


def latency(samples: list[tuple[float, float]], start: float, end: float) -> dict[str, Any]:
    """p50, p99 and max in ms of the samples (start, seconds) begun within [start, end)."""
    chosen = [seconds * 1000 for began, seconds in samples if start <= began < end]
    return {
        "n": len(chosen),
        "p50_ms": round(percentile(chosen, 50), 2),
        "p99_ms": round(percentile(chosen, 99), 2),
        "max_ms": round(max(chosen), 2) if chosen else float("nan"),
    }


class Load:
    """A producer and a relay-like lease loop, each on its own connection, timed."""

    def __init__(self, producer: Any, leaser: Any) -> None:
        self.producer, self.leaser = producer, leaser
        self.commits: list[tuple[float, float]] = []
        self.leases: list[tuple[float, float]] = []
        self.produced = self.delivered = 0
        self.stop = asyncio.Event()

    async def produce(self, rate: float, per_commit: int = 1) -> None:
        """``rate`` messages a second, ``per_commit`` in each transaction, on schedule."""
        started = time.monotonic()
        while not self.stop.is_set():
            delay = started + self.produced / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            began = time.monotonic()
            async with self.producer.transaction():
                for _ in range(per_commit):
                    await outbox.enqueue(self.producer, EVENT_TYPE, payload(self.produced))
                    self.produced += 1
            self.commits.append((began, time.monotonic() - began))

    async def lease_once(self, timed: bool = True) -> int:
        began = time.monotonic()
        # As the relay asks (its batch size as the usual size): the statement it plans once.
        lease = await PostgresStore(self.leaser).lease_batch(
            LEASE_BATCH, 30.0, usual_size=LEASE_BATCH
        )
        if timed:
            self.leases.append((began, time.monotonic() - began))
        if lease.messages:
            now = time.time()
            sent = [
                SentAttempt(m.message_id, EVENT_TYPE, m.attempt, now, 1, 204)
                for m in lease.messages
            ]
            await PostgresStore(self.leaser).record_delivered(lease.messages, sent)
            self.delivered += len(lease.messages)
        return len(lease.messages)

    async def lease(self) -> None:
        while not self.stop.is_set():
            await self.lease_once()
            await asyncio.sleep(LEASE_EVERY)

    async def finish(self) -> None:
        """Deliver what is left, untimed."""
        while await self.lease_once(timed=False):
            pass


async def backend_wal(conn: Any) -> int | None:
    """The WAL this connection's backend has written (PostgreSQL 18), or None."""
    if not await conn.fetchval("SELECT to_regproc('pg_stat_get_backend_wal') IS NOT NULL"):
        return None
    await conn.execute("SELECT pg_stat_force_next_flush()")
    value = await conn.fetchval("SELECT wal_bytes FROM pg_stat_get_backend_wal(pg_backend_pid())")
    return int(value)


async def server_io(conn: Any) -> dict[str, int | None]:
    """Blocks read, written and extended by the whole server so far (pg_stat_io, PostgreSQL
    16+, relations only); on older servers the writes from pg_stat_bgwriter, reads unknown."""
    await conn.execute("SELECT pg_stat_force_next_flush()")
    if await conn.fetchval("SELECT to_regclass('pg_catalog.pg_stat_io') IS NOT NULL"):
        row = await conn.fetchrow(
            "SELECT coalesce(sum(reads), 0)::bigint AS reads, "
            "coalesce(sum(writes), 0)::bigint AS writes, "
            "coalesce(sum(extends), 0)::bigint AS extends "
            "FROM pg_stat_io WHERE object IN ('relation', 'temp relation')"
        )
        return dict(row)
    writes = await conn.fetchval(
        "SELECT buffers_checkpoint + buffers_clean + buffers_backend FROM pg_stat_bgwriter"
    )
    return {"reads": None, "writes": int(writes), "extends": None}


def io_delta(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int | None]:
    return {
        key: None if before[key] is None or after[key] is None else after[key] - before[key]  # type: ignore[operator]
        for key in before
    }


async def sizes(conn: Any) -> dict[str, int]:
    """Heap (with TOAST) and index bytes of the outbox's tables, every partition counted."""
    tables = ["outbox_messages", "outbox_attempts"]
    if await conn.fetchval("SELECT to_regclass('outbox_message_ids') IS NOT NULL"):
        tables.append("outbox_message_ids")
    row = await conn.fetchrow(
        "SELECT coalesce(sum(pg_table_size(t.relid)), 0)::bigint AS table_bytes, "
        "coalesce(sum(pg_indexes_size(t.relid)), 0)::bigint AS index_bytes "
        "FROM unnest($1::text[]) AS n, LATERAL ("
        "  SELECT relid FROM pg_partition_tree(n::regclass) WHERE isleaf"
        "  UNION ALL SELECT c.oid FROM pg_class AS c WHERE c.oid = n::regclass AND c.relkind = 'r'"
        ") AS t",
        tables,
    )
    return {"table_bytes": row["table_bytes"], "index_bytes": row["index_bytes"]}


# ---------------------------------------------------------------------------------------------
# Retention: DROP against DELETE

LINES = json.dumps(payload(0)["lines"])
FILL_DAY = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, processing_started_at, processed_at, lease_token,
                             created_at)
SELECT gen_random_uuid(), $4,
       jsonb_build_object('orderId', g, 'customerId', 'cus_' || lpad((g % 9973)::text, 6, '0'),
                          'currency', 'EUR', 'total', to_char(g % 500 + 19.99, 'FM990.00'),
                          'lines', $5::jsonb, 'placedAt', c.at),
       'Processed', 1, c.at, c.at + interval '20 ms', c.at + interval '50 ms',
       gen_random_uuid(), c.at
FROM generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT $2::timestamptz + (g::float8 / $1) * ($3::timestamptz - $2::timestamptz)
              AS at) AS c
"""
# Retries waiting (Pending, due tomorrow) and given-up messages (Failed), one a minute.
FILL_LIVE = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, last_error, created_at)
SELECT gen_random_uuid(), $3, jsonb_build_object('orderId', -g), s.status,
       CASE s.status WHEN 'Failed' THEN 10 ELSE 3 END,
       CASE s.status WHEN 'Pending' THEN now() + interval '1 day' ELSE c.at END,
       'HTTP 503 Service Unavailable', c.at
FROM generate_series(1, $1) AS g,
     unnest(ARRAY['Pending', 'Failed']) AS s(status),
     LATERAL (SELECT $2::timestamptz + g * interval '1 minute' AS at) AS c
RETURNING outbox_message_id
"""
FILL_ATTEMPTS = """
INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, started_at,
                             finished_at, duration_ms, outcome, applied, http_status, recorded_at)
SELECT outbox_message_id, 1, coalesce(lease_token, outbox_message_id),
       coalesce(processing_started_at, created_at), coalesce(processed_at, created_at), 30,
       CASE status WHEN 'Processing' THEN 'Pending' ELSE status END, true,
       CASE status WHEN 'Processed' THEN 204 ELSE 503 END,
       coalesce(processed_at, created_at + interval '50 ms')
FROM outbox_messages
"""


class Days:
    """The three simulated days, from the fill's moment ``now``."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        # The oldest: one whole UTC day (one daily partition), its last rows finished a second
        # before it ends.
        self.oldest = (midnight - timedelta(days=3), midnight - timedelta(days=2, seconds=1))
        self.newer = [
            (now - timedelta(days=2) + MARGIN, now - timedelta(days=1)),
            (now - timedelta(days=1), now - timedelta(minutes=1)),
        ]
        self.partitions_from = midnight - timedelta(days=3)


async def fill_days(conn: Any, days: Days, per_day: int, live: int) -> list[uuid.UUID]:
    started = time.monotonic()
    for lower, upper in (days.oldest, *days.newer):
        await conn.execute(FILL_DAY, per_day, lower, upper, EVENT_TYPE, LINES)
    ids = [r[0] for r in await conn.fetch(FILL_LIVE, live, days.oldest[0], EVENT_TYPE)]
    await conn.execute(FILL_ATTEMPTS)
    await settle(conn)
    log(f"retention: {3 * per_day:,} messages filled in {time.monotonic() - started:.0f} s")
    return ids


async def retention_run(
    layout: str, per_day: int, live: int, rate: float, quiet: float
) -> dict[str, Any]:
    async with Database("partret") as db:
        conn = await db.connect()
        producer, leaser = await db.connect(), await db.connect()
        try:
            await prepare(db, conn, layout)
            days = Days(await conn.fetchval("SELECT now()"))
            if layout == "partitioned":
                await layout_ops.ensure_partitions(conn, days.partitions_from, days.now)
            live_ids = await fill_days(conn, days, per_day, live)
            before = await sizes(conn)
            live_attempts = await _attempts_of(conn, live_ids)
            load = Load(producer, leaser)
            tasks = [asyncio.create_task(load.produce(rate)), asyncio.create_task(load.lease())]
            await asyncio.sleep(quiet)
            purged = await timed_purge(conn, days)
            load.stop.set()
            await asyncio.gather(*tasks)
            await load.finish()
            purged.update(await after_purge(conn))
            purged["purge_io_blocks"] = io_delta(purged.pop("_io_before"), purged.pop("_io_after"))
            quiet_start = purged["started"] - quiet
            checked = await check_retention(conn, days, per_day, live_ids, live_attempts, load)
        finally:
            for c in (conn, producer, leaser):
                await c.close()
    window = (purged.pop("started"), purged.pop("ended"))
    result = {
        "layout": layout,
        "per_day": per_day,
        "size_before": before,
        **purged,
        **checked,
        "lease_before": latency(load.leases, quiet_start, window[0]),
        "lease_during": latency(load.leases, *window),
        "commit_before": latency(load.commits, quiet_start, window[0]),
        "commit_during": latency(load.commits, *window),
    }
    log(f"retention {layout}: {json.dumps(result, default=str)}")
    log(
        f"retention {layout}: purge {result['purge_seconds']:.2f} s, WAL "
        f"{result['purge_wal_bytes']:,} B, lease p99 before/during "
        f"{result['lease_before']['p99_ms']:g}/{result['lease_during']['p99_ms']:g} ms, commit "
        f"p99 {result['commit_before']['p99_ms']:g}/{result['commit_during']['p99_ms']:g} ms"
    )
    return result


async def timed_purge(conn: Any, days: Days) -> dict[str, Any]:
    if await conn.fetchval("SELECT now()") - days.now > MARGIN:
        raise RuntimeError("retention: the fill took longer than the margin; the purge would not")
    own, io, lsn = await backend_wal(conn), await server_io(conn), await wal_lsn(conn)
    started = time.monotonic()
    report = await operations.purge(
        conn, retention_days=2, failed_retention_days=None, batch_size=1000
    )
    ended = time.monotonic()
    server_wal = await wal_bytes(conn, lsn, await wal_lsn(conn))
    own_after = await backend_wal(conn)
    return {
        "started": started,
        "ended": ended,
        "purge_seconds": round(ended - started, 3),
        "purge_wal_bytes": own_after - own if own is not None and own_after is not None else None,
        "purge_wal_bytes_server": server_wal,
        "purge_report": report.as_dict(),
        "_io_before": io,
    }


async def after_purge(conn: Any) -> dict[str, Any]:
    """The CHECKPOINT that writes what the purge dirtied, then the sizes, a VACUUM, the sizes."""
    await conn.execute("CHECKPOINT")
    await asyncio.sleep(1.0)  # the checkpointer's I/O counts reach pg_stat_io
    size_after = await sizes(conn)
    own = await backend_wal(conn)
    started = time.monotonic()
    await conn.execute("VACUUM outbox_messages, outbox_attempts")
    vacuum_seconds = time.monotonic() - started
    own_after = await backend_wal(conn)
    return {
        "size_after": size_after,
        "vacuum_seconds": round(vacuum_seconds, 3),
        "vacuum_wal_bytes": own_after - own if own is not None and own_after is not None else None,
        "size_after_vacuum": await sizes(conn),
        "_io_after": await server_io(conn),
    }


async def _attempts_of(conn: Any, ids: list[uuid.UUID]) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM outbox_attempts WHERE outbox_message_id = ANY ($1::uuid[])", ids
        )
    )


async def check_retention(
    conn: Any,
    days: Days,
    per_day: int,
    live_ids: list[uuid.UUID],
    live_attempts: int,
    load: Load,
) -> dict[str, Any]:
    """Every row accounted for: the live rows and their history kept, the oldest day's Processed
    rows gone, the newer days' and the producer's all there (and delivered)."""
    count = conn.fetchval
    kept_live = await count(
        "SELECT count(*) FROM outbox_messages WHERE outbox_message_id = ANY ($1::uuid[])", live_ids
    )
    kept_history = await _attempts_of(conn, live_ids)
    oldest_left = await count(
        "SELECT count(*) FROM outbox_messages WHERE created_at < $1 AND status = 'Processed'",
        days.oldest[1] + timedelta(seconds=1),
    )
    newer = await count(
        "SELECT count(*) FROM outbox_messages WHERE created_at >= $1 AND created_at < $2",
        days.newer[0][0],
        days.now,
    )
    newer_history = await count(
        "SELECT count(*) FROM outbox_attempts WHERE recorded_at >= $1 AND recorded_at < $2",
        days.newer[0][0],
        days.now,
    )
    produced = await count(
        "SELECT count(*) FROM outbox_messages WHERE created_at >= $1 AND status = 'Processed'",
        days.now,
    )
    found = {
        "live_kept": kept_live,
        "live_history_kept": kept_history,
        "oldest_processed_left": oldest_left,
        "newer_kept": newer,
        "newer_history_kept": newer_history,
        "produced_delivered": produced,
    }
    wanted = {
        "live_kept": len(live_ids),
        "live_history_kept": live_attempts,
        "oldest_processed_left": 0,
        "newer_kept": 2 * per_day,
        "newer_history_kept": 2 * per_day,
        "produced_delivered": load.produced,
    }
    if found != wanted or load.delivered != load.produced:
        raise AssertionError(
            f"retention: rows not accounted for: {found}, wanted {wanted}; "
            f"delivered {load.delivered} of {load.produced}"
        )
    return {"accounted": found, "produced": load.produced}


async def measure_retention(
    *, per_day: int, live: int, rate: float, quiet: float, runs: int
) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for n in range(runs):
        # Alternate which layout goes first, against drift.
        order = LAYOUTS if n % 2 == 0 else LAYOUTS[::-1]
        done = {}
        for layout in order:
            done[layout] = await retention_run(layout, per_day, live, rate, quiet)
        rounds.append(done)

    def wal(r: dict[str, Any]) -> float:
        own = r["purge_wal_bytes"]
        return float(own if own is not None else r["purge_wal_bytes_server"])

    def total(size: str) -> Callable[[dict[str, Any]], float]:
        return lambda r: float(r[size]["table_bytes"] + r[size]["index_bytes"])

    return {
        "per_day": per_day,
        "live": live,
        "rate": rate,
        "quiet_seconds": quiet,
        "rounds": rounds,
        "ratios": {
            name: ratio_summary(per_round(rounds, key))
            for name, key in {
                "purge_seconds": lambda r: r["purge_seconds"],
                "purge_wal_bytes": wal,
                "size_after": total("size_after"),
                "size_after_vacuum": total("size_after_vacuum"),
                "lease_p99_during": lambda r: r["lease_during"]["p99_ms"],
                "commit_p99_during": lambda r: r["commit_during"]["p99_ms"],
            }.items()
        },
    }


# ---------------------------------------------------------------------------------------------
# The hot path on partitions


async def hotpath_run(
    receiver: ReceiverProcess, layout: str, messages: int, past_days: int, interval: str
) -> dict[str, Any]:
    await receiver.reset()
    async with Database("parthot") as db:
        conn = await db.connect()
        try:
            await prepare(db, conn, layout, past_days, interval)
            partitions = await _partition_count(conn)
            await settle(conn)
            start = await wal_lsn(conn)
            began = time.monotonic()
            await enqueue_outbox(conn, messages)
            enqueue_seconds = time.monotonic() - began
            enqueued = await wal_bytes(conn, start, await wal_lsn(conn))
            await settle(conn)
            start = await wal_lsn(conn)
            meter = CpuMeter(receiver.pid)
            command = worker_command(
                db, receiver.url("/hook"), 16, "--messages", str(messages), "--lease-times"
            )
            output = await asyncio.to_thread(run_worker, command)
            cpu = meter.stop()
            drained = await wal_bytes(conn, start, await wal_lsn(conn))
            counts = await outbox_counts(conn)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if counts != {"Processed": messages} or stats.distinct != messages:
        raise AssertionError(f"hotpath {layout}: {counts}, receiver saw {stats.distinct} ids")
    leases = output["lease_seconds"]
    result = {
        "layout": layout,
        "messages": messages,
        "partitions": partitions,
        "enqueue_wal_bytes_per_message": round(enqueued / messages, 1),
        "enqueue_us_per_message": round(enqueue_seconds / messages * 1e6, 1),
        "drain_wal_bytes_per_message": round(drained / messages, 1),
        "drain_postgres_cpu_us_per_message": round(cpu["postgres"] / messages * 1e6, 1),
        "drain_rate": round(messages / output["wall_seconds"], 1),
        "lease_median_ms": round(median(leases) * 1000, 2),
        "lease_p99_ms": round(percentile(leases, 99) * 1000, 2),
    }
    log(f"hotpath {layout}: {result}")
    return result


HOTPATH_FIGURES = (
    "enqueue_wal_bytes_per_message",
    "enqueue_us_per_message",
    "drain_wal_bytes_per_message",
    "drain_postgres_cpu_us_per_message",
    "lease_median_ms",
)

# Judged against HOTPATH_TARGET: what a message costs to enqueue and to deliver.
HOTPATH_JUDGED = (
    "enqueue_wal_bytes_per_message",
    "enqueue_us_per_message",
    "drain_wal_bytes_per_message",
    "drain_time_per_message",
)


async def _partition_count(conn: Any) -> int:
    """The message table's partitions, the default one included (0 on the plain table)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox_messages'::regclass"
        )
    )


async def measure_hotpath(
    receiver: ReceiverProcess,
    *,
    messages: int,
    runs: int,
    past_days: int,
    interval: str = layout_ops.DEFAULT_INTERVAL,
) -> dict[str, Any]:
    rounds = []
    for n in range(runs):
        order = LAYOUTS if n % 2 == 0 else LAYOUTS[::-1]
        rounds.append(
            {
                layout: await hotpath_run(receiver, layout, messages, past_days, interval)
                for layout in order
            }
        )
    ratios = {
        name: ratio_summary(per_round(rounds, lambda r, name=name: float(r[name])))
        for name in HOTPATH_FIGURES
    }
    # A rate: plain ÷ partitioned, so that above 1 is a cost as in the other ratios.
    ratios["drain_time_per_message"] = ratio_summary(
        per_round(rounds, lambda r: 1.0 / r["drain_rate"])
    )
    targets = {
        name: {
            "value": ratios[name]["median"],
            "target": f"<= {HOTPATH_TARGET:g}",
            "met": ratios[name]["median"] <= HOTPATH_TARGET,
        }
        for name in HOTPATH_JUDGED
    }
    return {
        "messages": messages,
        "past_days": past_days,
        "interval": interval,
        "rounds": rounds,
        "ratios": ratios,
        "targets": targets,
    }


# ---------------------------------------------------------------------------------------------
# Bloat resistance: a transaction held open during a steady stream


async def dead_tuples(conn: Any) -> int:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables "
            "WHERE relname LIKE 'outbox\\_messages%'"
        )
    )


async def due_index_bytes(conn: Any) -> int:
    """The size of the lease's indexes, every partition's counted."""
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(pg_relation_size(t.relid)), 0)::bigint "
            "FROM unnest($1::text[]) AS n, LATERAL ("
            "  SELECT relid FROM pg_partition_tree(n::regclass) WHERE isleaf"
            "  UNION ALL SELECT c.oid FROM pg_class AS c WHERE c.oid = n::regclass "
            "  AND c.relkind = 'i'"
            ") AS t",
            ["outbox_messages_due_idx", "outbox_messages_pending_unkeyed_idx"],
        )
    )


async def vacuum_every(conn: Any, seconds: float, stop: asyncio.Event, took: list[float]) -> None:
    """What autovacuum would do, every ``seconds``: VACUUM and ANALYZE the message table's
    leaves (the plain table, or each partition: autovacuum never analyzes a partitioned parent).
    VACUUM alone left the statistics of the table's first moments, and with them lease plans made
    for a few rows that sorted hundreds of thousands (docs/performance.md, "Bloat resistance")."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            began = time.monotonic()
            leaves = await conn.fetch(
                "SELECT relid::regclass::text AS name"
                " FROM pg_partition_tree('outbox_messages') WHERE isleaf"
            )
            await conn.execute(f"VACUUM (ANALYZE) {', '.join(r['name'] for r in leaves)}")
            took.append(time.monotonic() - began)


def bloat_result(
    layout: str,
    held: bool,
    load: Load,
    rate: float,
    window: tuple[float, float],
    left: tuple[int, int],
    vacuums: list[float],
) -> dict[str, Any]:
    """A bloat arm's figures over its stream (``window``), logged as they are taken;
    ``left``: dead tuples and the due indexes' bytes at its end."""
    began, ended = window
    last_quarter = ended - (ended - began) / 4
    result = {
        "layout": layout,
        "held_transaction": held,
        "messages": load.produced,
        "delivered_in_stream": load.delivered,
        "offered_rate": rate,
        "achieved_rate": round(load.produced / (ended - began), 1),
        "lease": latency(load.leases, began, ended),
        "lease_last_quarter": latency(load.leases, last_quarter, ended),
        "dead_tuples_at_end": left[0],
        "due_index_bytes_at_end": left[1],
        "vacuums": len(vacuums),
        "vacuum_median_seconds": round(median(vacuums), 3) if vacuums else None,
    }
    log(
        f"bloat {layout} held={held}: lease p50/p99 {result['lease']['p50_ms']:g}/"
        f"{result['lease']['p99_ms']:g} ms (last quarter p99 "
        f"{result['lease_last_quarter']['p99_ms']:g}), {left[0]:,} dead tuples, "
        f"{load.delivered:,} of {load.produced:,} delivered in the stream"
    )
    return result


async def bloat_run(
    layout: str, held: bool, rate: float, seconds: float, vacuum_seconds: float
) -> dict[str, Any]:
    async with Database("partbloat") as db:
        conns = [await db.connect() for _ in range(4)]
        conn, producer, leaser, holder = conns
        try:
            await prepare(db, conn, layout)
            await settle(conn)
            if held:
                await holder.execute("BEGIN")
                await holder.fetchval("SELECT txid_current()")
            load = Load(producer, leaser)
            vacuums: list[float] = []
            began = time.monotonic()
            per_commit = max(1, round(rate * 0.05))
            tasks = [
                asyncio.create_task(load.produce(rate, per_commit)),
                asyncio.create_task(load.lease()),
                asyncio.create_task(vacuum_every(conn, vacuum_seconds, load.stop, vacuums)),
            ]
            await asyncio.sleep(seconds)
            load.stop.set()
            await asyncio.gather(*tasks)
            ended = time.monotonic()
            dead, due = await dead_tuples(conn), await due_index_bytes(conn)
            # The stream's figures, said before the catch-up below (which can take far longer
            # than the stream when the held transaction left the lease behind).
            result = bloat_result(layout, held, load, rate, (began, ended), (dead, due), vacuums)
            if held:
                await holder.execute("ROLLBACK")
            caught_up = time.monotonic()
            await load.finish()
            result["catch_up_seconds"] = round(time.monotonic() - caught_up, 1)
            counts = await outbox_counts(conn)
        finally:
            for c in conns:
                await c.close()
    if counts != {"Processed": load.produced} or load.delivered != load.produced:
        raise AssertionError(f"bloat {layout}: {counts}, delivered {load.delivered}")
    return result


async def measure_bloat(
    *, rate: float, seconds: float, vacuum_every: float, runs: int
) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(runs):
        order = LAYOUTS if n % 2 == 0 else LAYOUTS[::-1]
        done: dict[str, dict[str, Any]] = {}
        for layout in order:
            for held in (False, True):
                name = f"{layout}_{'held' if held else 'free'}"
                done[name] = await bloat_run(layout, held, rate, seconds, vacuum_every)
        rounds.append(done)

    def p99(arm: str, window: str = "lease") -> Callable[[dict[str, Any]], float]:
        return lambda r: float(r[arm][window]["p99_ms"])

    def within(numerator: str, denominator: str, window: str) -> dict[str, float]:
        return ratio_summary(
            [round(p99(numerator, window)(r) / p99(denominator, window)(r), 3) for r in rounds]
        )

    return {
        "rate": rate,
        "seconds": seconds,
        "vacuum_every_seconds": vacuum_every,
        "rounds": rounds,
        "ratios": {
            f"{layout}_held_vs_free_p99{suffix}": within(f"{layout}_held", f"{layout}_free", window)
            for layout in LAYOUTS
            for suffix, window in (("", "lease"), ("_last_quarter", "lease_last_quarter"))
        }
        | {
            f"partitioned_vs_plain_p99_{state}": within(
                f"partitioned_{state}", f"plain_{state}", "lease"
            )
            for state in ("free", "held")
        },
    }


# ---------------------------------------------------------------------------------------------
# The table's lines


def table_lines(doc: dict[str, Any]) -> list[str]:
    section = doc.get("partitions")
    if not section:
        return []
    lines = []
    if "retention" in section:
        r = section["retention"]
        ratios = r["ratios"]
        lines.append(
            f"| purge of one day ({r['per_day']:,} messages), partitioned ÷ plain: wall; WAL; "
            f"size after; lease p99 during | {_ratio(ratios['purge_seconds'])}; "
            f"{_ratio(ratios['purge_wal_bytes'])}; {_ratio(ratios['size_after'])}; "
            f"{_ratio(ratios['lease_p99_during'])} | |"
        )
    if "hotpath" in section:
        for name, verdict in section["hotpath"]["targets"].items():
            mark = "met" if verdict["met"] else "**missed**"
            lines.append(
                f"| partitioned ÷ plain: {name.replace('_', ' ')} | {verdict['value']:g} | "
                f"{verdict['target']} ({mark}) |"
            )
    if "bloat" in section:
        b = section["bloat"]
        for name, value in b["ratios"].items():
            lines.append(f"| lease p99 {name.replace('_', ' ')} | {_ratio(value)} | |")
    return lines


def _ratio(summary: dict[str, float]) -> str:
    return f"{summary['median']:g} ({summary['low']:g} to {summary['high']:g})"
