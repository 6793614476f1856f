"""The log-tailing prototype measured beside the polling relay: the same receiver process, the same
HTTP client settings, the same messages, each run on a fresh database of a private PostgreSQL 18.

Contenders (``CONTENDERS``):

- ``poll``: the polling relay, on a server with ``wal_level = logical`` (what it pays once the
  server is set up for log tailing): ``bench.worker relay`` for a drain, ``outbox serve`` with
  ``OUTBOX_WAKEUP=postgres`` (a NOTIFY after each producer's commit) at a steady rate.
- ``poll-replica``: the same polling relay on a server with ``wal_level = replica`` (the default,
  and what the relay costs today); drains only.
- ``stream``: the prototype (``bench.logical.tailer``) over the replication protocol, its
  outcomes in ``outbox_logical_outcomes``.
- ``stream-rows``: the same, its outcomes written to the outbox rows and ``outbox_attempts`` as
  the polling relay writes them (``status``, the console and ``show`` unchanged).
- ``sql``: the prototype reading the slot through ``pg_logical_slot_peek_binary_changes`` with
  asyncpg, its outcomes in ``outbox_logical_outcomes``.
- ``stream-delete``: ``stream`` with an insert-and-delete producer: each transaction deletes the
  outbox rows it inserted before it commits, so the table stays empty and only the log holds the
  event.

Sections:

- ``throughput``: a backlog of ``messages`` enqueued, then drained; rounds interleaved, order drawn
  per round. Per contender: msg/s, its process's CPU, PostgreSQL's CPU (every backend and the
  walsender) and WAL per message.
- ``latency``: ``rate`` messages a second, each its own transaction, for ``seconds``, with the
  relay already running: commit → 2xx p50 / p95 / p99 at the receiver, and per message the
  database's CPU and WAL; ``produce`` is the producer alone, no relay (what the inserts cost).
  With ``app_updates`` each message's transaction also updates that many rows of an application
  table outside the publication (what the walsender decodes and drops).
- ``held``: a session holds a snapshot and a transaction id while ``held_messages`` flow at
  ``held_rate``: dead tuples in ``outbox_messages`` after (and after a VACUUM: those it may not
  remove), the tables' sizes, and the WAL the slot keeps.
- ``order``: ``order_keys`` pairs of transactions on one ordering key, the first to begin
  committing last; then each contender drains them: per key, whether the receiver got them in
  commit order or in ``created_at`` order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import asyncpg
import psutil

import outbox
from bench import receiver as receiver_module
from bench.common import (
    ENQUEUE_CHUNK,
    EVENT_TYPE,
    ROOT,
    SECRET,
    CpuMeter,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    outbox_wall_seconds,
    payload,
    percentile,
    settle,
    with_database,
)
from bench.logical import tailer
from bench.server import BenchServer, wal_bytes, wal_lsn
from bench.throughput import Options, run_worker
from outbox.store.migrate import migrate
from tests.support.azure import free_port
from tests.support.processes import Child

CONTENDERS = ("poll", "poll-replica", "stream", "stream-rows", "sql", "stream-delete")
TAILERS = {
    "stream": ("stream", "outcomes"),
    "stream-rows": ("stream", "rows"),
    "sql": ("sql", "outcomes"),
    "stream-delete": ("stream", "outcomes"),
}
# Producers that delete the rows they insert, in the same transaction.
DELETING = {"stream-delete"}
DELETE = "DELETE FROM outbox_messages WHERE outbox_message_id = ANY($1::uuid[])"
BASELINE = "poll"


@dataclass
class Servers:
    logical: BenchServer
    replica: BenchServer | None

    def of(self, contender: str) -> BenchServer:
        if contender == "poll-replica":
            assert self.replica is not None
            return self.replica
        return self.logical


class ServerCpu(CpuMeter):
    """``bench.common.CpuMeter`` (the receiver's and PostgreSQL's CPU seconds) for a private
    server's postmaster, plus any other process (the relay) by its id."""

    def __init__(self, receiver_pid: int, server: BenchServer, relay_pid: int | None = None):
        self._receiver = psutil.Process(receiver_pid)
        assert server.postmaster_pid is not None
        self._postmaster = psutil.Process(server.postmaster_pid)
        self._relay = psutil.Process(relay_pid) if relay_pid else None
        self._relay_start = self._relay_seconds()
        self._start = self._sample()

    def _relay_seconds(self) -> float:
        if self._relay is None:
            return 0.0
        times = self._relay.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> dict[str, float]:
        result = super().stop()
        if self._relay is not None:
            result["relay"] = round(self._relay_seconds() - self._relay_start, 2)
        return result


class Database:
    """A fresh database on a private server (``bench.common.Database`` uses the benchmark's
    own), dropped on exit with its replication slot."""

    def __init__(self, server: BenchServer, prefix: str) -> None:
        self.server = server
        self.name = f"logical_{prefix.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        self.url = with_database(server.admin_dsn, self.name)

    async def __aenter__(self) -> Database:
        admin = await asyncpg.connect(self.server.admin_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(self.url)
        try:
            await migrate(conn)
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *_: object) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await tailer.drop_slot(conn)
        finally:
            await conn.close()
        admin = await asyncpg.connect(self.server.admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await admin.close()

    async def connect(self) -> Any:
        return await asyncpg.connect(self.url)


def tailer_command(
    contender: str, db: Database, url: str, concurrency: int, messages: int = 0
) -> list[str]:
    """``python -m bench.logical.worker …`` for a tailing contender; a drain with ``messages``."""
    source, record = TAILERS[contender]
    options = {
        "--source": source,
        "--record": record,
        "--database-url": db.url,
        "--url": url,
        "--concurrency": str(concurrency),
        "--messages": str(messages),
    }
    return [sys.executable, "-m", "bench.logical.worker", *chain.from_iterable(options.items())]


def run_tailer(
    contender: str, db: Database, url: str, concurrency: int, messages: int
) -> dict[str, Any]:
    done = subprocess.run(
        tailer_command(contender, db, url, concurrency, messages),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{contender} worker failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def done_counts(conn: Any, contender: str) -> dict[str, int]:
    """Messages by outcome as the contender recorded them."""
    if contender in ("poll", "poll-replica", "stream-rows"):
        rows = await conn.fetch("SELECT status, count(*) AS n FROM outbox_messages GROUP BY 1")
    else:
        rows = await conn.fetch(
            "SELECT outcome AS status, count(*) AS n FROM outbox_logical_outcomes GROUP BY 1"
        )
    return {row["status"]: row["n"] for row in rows}


async def slot_state(conn: Any) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained,"
        " pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS unconfirmed"
        " FROM pg_replication_slots WHERE slot_name = $1",
        tailer.SLOT,
    )
    return dict(row) if row else None


def top_wal_records(stats: dict[str, dict[str, int]] | None, messages: int) -> dict[str, float]:
    """The drain's WAL by record type, bytes per message, the largest first."""
    if not stats:
        return {}
    ordered = sorted(stats.items(), key=lambda kv: -kv[1]["total_bytes"])
    return {kind: round(s["total_bytes"] / messages, 1) for kind, s in ordered[:8]}


# --- throughput ------------------------------------------------------------------------------


async def drain_once(
    contender: str, servers: Servers, receiver: ReceiverProcess, messages: int, concurrency: int
) -> dict[str, Any]:
    await receiver.reset()
    server = servers.of(contender)
    async with Database(server, contender) as db:
        conn = await db.connect()
        try:
            if contender in TAILERS:
                await tailer.prepare(conn)
            await conn.execute("CHECKPOINT")
            start = await wal_lsn(conn)
            if contender in DELETING:
                await enqueue_and_delete(conn, messages)
            else:
                await enqueue_outbox(conn, messages)
            enqueued = await wal_bytes(conn, start, await wal_lsn(conn))
            await settle(conn)
            start = await wal_lsn(conn)
            meter = ServerCpu(receiver.pid, server)
            url = receiver.url("/hook")
            if contender in TAILERS:
                worker = await asyncio.to_thread(
                    run_tailer, contender, db, url, concurrency, messages
                )
            else:
                options = Options(messages=messages, concurrency=concurrency)
                worker = await asyncio.to_thread(run_worker, "relay", url, db.url, options)
            cpu = meter.stop()
            end = await wal_lsn(conn)
            drained = await wal_bytes(conn, start, end)
            counts = await done_counts(conn, contender)
            if contender in TAILERS:
                wall = float(worker["wall_seconds"])
                slot = await slot_state(conn)
            else:
                wall = await outbox_wall_seconds(conn)
                slot = None
        finally:
            await conn.close()
    stats = await receiver.stats()
    if stats.distinct != messages or counts != {"Processed": messages}:
        raise AssertionError(f"{contender}: receiver saw {stats.distinct}, recorded {counts}")
    result = {
        "contender": contender,
        "messages": messages,
        "wall_seconds": round(wall, 4),
        "rate": round(messages / wall, 1),
        # The whole run as the worker timed it, its connections' start included.
        "process_rate": round(
            messages / worker["run_seconds" if contender in TAILERS else "wall_seconds"], 1
        ),
        "worker_cpu_us_per_message": round(worker["cpu_seconds"] / messages * 1e6, 1),
        "postgres_cpu_us_per_message": round(cpu["postgres"] / messages * 1e6, 1),
        "receiver_cpu_us_per_message": round(cpu["receiver"] / messages * 1e6, 1),
        # What the run cost the machine's cores: with the relay, the receiver and PostgreSQL on
        # the same two, the ceiling of its rate, steadier than the rate while others load them.
        "total_cpu_us_per_message": round(
            (worker["cpu_seconds"] + cpu["postgres"] + cpu["receiver"]) / messages * 1e6, 1
        ),
        "drain_wal_bytes_per_message": round(drained / messages, 1),
        "enqueue_wal_bytes_per_message": round(enqueued / messages, 1),
        "drain_wal_by_record": top_wal_records(server.wal_stats(start, end), messages),
        "peak_rss_mb": worker["peak_rss_mb"],
        "requests": stats.requests,
        "slot_after": slot,
        "worker": {k: v for k, v in worker.items() if k != "summary"},
    }
    log(
        f"logical throughput {contender}: {result['rate']:,.0f} msg/s, worker "
        f"{result['worker_cpu_us_per_message']} µs/msg, PostgreSQL "
        f"{result['postgres_cpu_us_per_message']} µs/msg, WAL "
        f"{result['drain_wal_bytes_per_message']} B/msg (enqueue "
        f"{result['enqueue_wal_bytes_per_message']})"
    )
    return result


async def enqueue_and_delete(conn: Any, count: int) -> None:
    """``enqueue_outbox``'s transactions, each deleting the rows it inserted before it commits."""
    for first in range(0, count, ENQUEUE_CHUNK):
        async with conn.transaction():
            ids = [
                await outbox.enqueue(conn, EVENT_TYPE, payload(i))
                for i in range(first, min(first + ENQUEUE_CHUNK, count))
            ]
            await conn.execute(DELETE, ids)


async def measure_throughput(
    servers: Servers,
    receiver: ReceiverProcess,
    *,
    contenders: tuple[str, ...],
    messages: int,
    rounds: int,
    concurrency: int,
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    order = random.Random()
    for round_ in range(1, rounds + 1):
        shuffled = list(contenders)
        order.shuffle(shuffled)
        log(f"logical throughput round {round_}: {', '.join(shuffled)}")
        for contender in shuffled:
            run = await drain_once(contender, servers, receiver, messages, concurrency)
            runs.append({"round": round_, **run})
    keys = (
        "rate",
        "process_rate",
        "worker_cpu_us_per_message",
        "postgres_cpu_us_per_message",
        "total_cpu_us_per_message",
        "drain_wal_bytes_per_message",
        "enqueue_wal_bytes_per_message",
    )
    return {
        "messages": messages,
        "rounds": rounds,
        "concurrency": concurrency,
        "runs": runs,
        "medians": medians(runs, contenders, keys),
        "ratios_to_poll": ratios(runs, contenders, keys),
    }


def medians(
    runs: list[dict[str, Any]], contenders: tuple[str, ...], keys: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    return {
        c: {k: median([r[k] for r in runs if r["contender"] == c]) for k in keys}
        for c in contenders
    }


def ratios(
    runs: list[dict[str, Any]],
    contenders: tuple[str, ...],
    keys: tuple[str, ...],
    group: str = "round",
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per round, each contender's figure ÷ the polling relay's: the median and the spread."""
    base = {r[group]: r for r in runs if r["contender"] == BASELINE}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for c in contenders:
        if c == BASELINE:
            continue
        out[c] = {}
        for k in keys:
            per_round = [
                r[k] / base[r[group]][k]
                for r in runs
                if r["contender"] == c and r[group] in base and base[r[group]][k]
            ]
            if per_round:
                out[c][k] = {
                    "median": round(median(per_round), 3),
                    "min": round(min(per_round), 3),
                    "max": round(max(per_round), 3),
                    "per_round": [round(x, 3) for x in per_round],
                }
    return out


# --- a steady rate ---------------------------------------------------------------------------


# The producer commits a transaction every TICK seconds (2 messages at 200/s, 10 at 1,000/s):
# one transaction per message costs this 2-core machine's shared Python producer more than the
# relays it measures, and fell short of 1,000/s.
TICK = 0.01


# An application's own table, updated in the producer's transactions when asked (``app_updates``):
# a logical walsender decodes every table's changes, not only the publication's, and
# ``wal_level = logical`` logs each update's whole new row.
APP_ROWS = 10_000
APP_SETUP = f"""
CREATE TABLE bench_app (
    id integer PRIMARY KEY,
    counter bigint NOT NULL DEFAULT 0,
    note text NOT NULL
);
INSERT INTO bench_app (id, note) SELECT i, repeat('x', 300) FROM generate_series(1, {APP_ROWS}) i;
"""
APP_UPDATE = "UPDATE bench_app SET counter = counter + 1 WHERE id = ANY($1::int[])"


@dataclass(frozen=True)
class Producer:
    """How the steady producer commits: a NOTIFY after each commit (the polling relay's
    wake-up), its outbox rows deleted before the commit (insert-and-delete), and
    ``app_updates`` rows of ``bench_app`` updated per message in the same transaction."""

    notify: bool = False
    delete: bool = False
    app_updates: int = 0

    @classmethod
    def of(cls, contender: str, app_updates: int = 0) -> Producer:
        return cls(contender == BASELINE, contender in DELETING, app_updates)

    def app_ids(self, first: int, count: int) -> list[int]:
        """Rows no transaction in flight at the same time updates too (no lock waits)."""
        n = self.app_updates
        return [(i * n + j) % APP_ROWS + 1 for i in range(first, first + count) for j in range(n)]


async def produce(pool: Any, first: int, count: int, producer: Producer) -> None:
    """``count`` events in one transaction, each stamped just before its insert (the figure
    includes the insert and the commit); after the commit a NOTIFY when the relay polls."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            ids = [
                await outbox.enqueue(conn, EVENT_TYPE, {**payload(i), "committedAt": time.time()})
                for i in range(first, first + count)
            ]
            if producer.app_updates:
                await conn.execute(APP_UPDATE, producer.app_ids(first, count))
            if producer.delete:
                await conn.execute(DELETE, ids)
        if producer.notify:
            await outbox.notify(conn=conn)


async def offer(pool: Any, messages: int, rate: float, producer: Producer) -> float:
    """Commit ``messages`` events at ``rate`` a second, on schedule; the rate achieved."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = []
    sent = tick = 0
    while sent < messages:
        tick += 1
        due = min(messages, round(tick * TICK * rate))
        if due > sent:
            tasks.append(asyncio.create_task(produce(pool, sent, due - sent, producer)))
            sent = due
        await asyncio.sleep(max(0.0, started + tick * TICK - loop.time()))
    await asyncio.gather(*tasks)
    return messages / (loop.time() - started)


@contextlib.asynccontextmanager
async def relay_running(
    contender: str, db: Database, url: str, concurrency: int
) -> AsyncIterator[Child | None]:
    """The contender's relay, running and ready, stopped (SIGTERM) after the block; ``produce``
    has none."""
    if contender == "produce":
        yield None
        return
    if contender in TAILERS:
        # Without --messages: until SIGTERM. Child.start runs ``python -m`` itself.
        command = tailer_command(contender, db, url, concurrency)[2:]
        child = await Child.start(*command, env={**os.environ})
        await child.wait_for_line(r"^ready$")
    else:
        env = {
            **os.environ,
            "OUTBOX_DATABASE_URL": db.url,
            "OUTBOX_WEBHOOKS": json.dumps({EVENT_TYPE: {"url": url, "secret": SECRET}}),
            "OUTBOX_WAKEUP": "postgres",
            "OUTBOX_CONCURRENCY": str(concurrency),
        }
        env.pop("AzureWebJobsStorage", None)
        child = await Child.start("outbox", "serve", "--port", str(free_port()), env=env)
        await child.wait_for_line(r"serving \d+ functions")
    try:
        yield child
    finally:
        code = await child.stop()
        if code != 0:
            raise RuntimeError(f"{contender} exited with {code}:\n{child.output[-3000:]}")
    if contender in TAILERS:  # its own account, the last line it printed
        last = next(line for line in reversed(child.lines) if line.startswith("{"))
        child.result = json.loads(last)  # type: ignore[attr-defined]


def relay_result(child: Child | None) -> dict[str, Any] | None:
    result: dict[str, Any] | None = getattr(child, "result", None)
    return result


async def wait_for(receiver: ReceiverProcess, messages: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (await receiver.stats()).distinct < messages:
        if time.monotonic() > deadline:
            got = (await receiver.stats()).distinct
            raise AssertionError(f"only {got} of {messages} arrived within {within:g} s")
        await asyncio.sleep(0.1)


async def steady_once(
    contender: str,
    servers: Servers,
    receiver: ReceiverProcess,
    rate: float,
    seconds: float,
    concurrency: int,
    app_updates: int = 0,
) -> dict[str, Any]:
    messages = int(rate * seconds)
    server = servers.logical
    async with Database(server, contender) as db:
        conn = await db.connect()
        pool = await asyncpg.create_pool(db.url, min_size=4, max_size=8)
        try:
            if app_updates:
                await conn.execute(APP_SETUP)
            if contender in TAILERS:
                await tailer.prepare(conn)
            await receiver.reset()
            async with relay_running(contender, db, receiver.url("/latency"), concurrency) as child:
                await conn.execute("CHECKPOINT")
                start = await wal_lsn(conn)
                meter = ServerCpu(receiver.pid, server, child.process.pid if child else None)
                offered = await offer(pool, messages, rate, Producer.of(contender, app_updates))
                if contender != "produce":
                    await wait_for(receiver, messages, within=60)
                cpu = meter.stop()
                written = await wal_bytes(conn, start, await wal_lsn(conn))
            worker = relay_result(child)
            counts = await done_counts(conn, contender) if contender != "produce" else {}
            slot = await slot_state(conn) if contender in TAILERS else None
        finally:
            await pool.close()
            await conn.close()
    result: dict[str, Any] = {
        "contender": contender,
        "rate": rate,
        "messages": messages,
        "offered_rate": round(offered, 1),
        "postgres_cpu_us_per_message": round(cpu["postgres"] / messages * 1e6, 1),
        "relay_cpu_us_per_message": round(cpu.get("relay", 0.0) / messages * 1e6, 1),
        "wal_bytes_per_message": round(written / messages, 1),
        "slot_after": slot,
        "worker": worker,
    }
    if contender != "produce":
        stats = await receiver.stats()
        if stats.distinct != messages or counts != {"Processed": messages}:
            raise AssertionError(f"{contender}: receiver saw {stats.distinct}, recorded {counts}")
        latencies = [1000 * x for x in stats.latencies]
        result.update(
            {
                "p50_ms": round(percentile(latencies, 50), 2),
                "p95_ms": round(percentile(latencies, 95), 2),
                "p99_ms": round(percentile(latencies, 99), 2),
                "max_ms": round(max(latencies), 2),
            }
        )
    log(f"logical latency {contender} at {rate:g}/s: {result}")
    return result


async def measure_latency(
    servers: Servers,
    receiver: ReceiverProcess,
    *,
    contenders: tuple[str, ...],
    rates: tuple[float, ...],
    seconds: float,
    rounds: int,
    concurrency: int,
    app_updates: int = 0,
) -> dict[str, Any]:
    order = random.Random()
    runs: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        for rate in rates:
            shuffled = ["produce", *contenders]
            order.shuffle(shuffled)
            log(f"logical latency round {round_} at {rate:g}/s: {', '.join(shuffled)}")
            for contender in shuffled:
                run = await steady_once(
                    contender, servers, receiver, rate, seconds, concurrency, app_updates
                )
                runs.append({"round": round_, "group": f"{round_}@{rate:g}", **run})
    keys = (
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "postgres_cpu_us_per_message",
        "wal_bytes_per_message",
        "relay_cpu_us_per_message",
        "offered_rate",
    )
    by_rate = {}
    for rate in rates:
        at = [r for r in runs if r["rate"] == rate]
        relayed = [r for r in at if r["contender"] != "produce"]
        figures = medians(at, ("produce",), (*keys[3:5], "offered_rate"))
        figures |= medians(relayed, contenders, keys)
        to_poll = ratios(relayed, contenders, keys, group="group")
        for c in contenders:
            figures[c]["relay_cost"] = relay_cost(at, c)
            if c != BASELINE:
                to_poll[c]["relay_cost"] = relay_cost_ratio(at, c)
        by_rate[f"{rate:g}"] = {"medians": figures, "ratios_to_poll": to_poll}
    return {
        "rates": list(rates),
        "seconds": seconds,
        "rounds": rounds,
        "app_updates": app_updates,
        "runs": runs,
        "by_rate": by_rate,
    }


def relay_cost(runs: list[dict[str, Any]], contender: str) -> dict[str, float]:
    """Per message, the database's CPU and WAL beyond the producer's alone (its median run
    subtracted from the contender's median)."""
    mine = [r for r in runs if r["contender"] == contender]
    alone = [r for r in runs if r["contender"] == "produce"]
    return {
        key: round(median([r[key] for r in mine]) - median([r[key] for r in alone]), 1)
        for key in ("postgres_cpu_us_per_message", "wal_bytes_per_message")
    }


def relay_cost_ratio(runs: list[dict[str, Any]], contender: str) -> dict[str, float]:
    mine, base = relay_cost(runs, contender), relay_cost(runs, BASELINE)
    return {k: round(mine[k] / base[k], 3) if base[k] else float("nan") for k in mine}


# --- a transaction held open -----------------------------------------------------------------

TABLES = """
SELECT relname, n_live_tup AS live, n_dead_tup AS dead,
       pg_total_relation_size(relid) AS bytes
FROM pg_stat_user_tables
WHERE relname IN ('outbox_messages', 'outbox_attempts', 'outbox_logical_outcomes')
"""


async def tables(conn: Any) -> dict[str, dict[str, int]]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(TABLES)
    return {r["relname"]: {k: r[k] for k in ("live", "dead", "bytes")} for r in rows}


async def held_once(
    contender: str,
    servers: Servers,
    receiver: ReceiverProcess,
    messages: int,
    rate: float,
    concurrency: int,
) -> dict[str, Any]:
    server = servers.logical
    async with Database(server, contender) as db:
        conn = await db.connect()
        held = await db.connect()
        pool = await asyncpg.create_pool(db.url, min_size=4, max_size=8)
        try:
            if contender in TAILERS:
                await tailer.prepare(conn)
            await receiver.reset()
            url = receiver.url("/latency")
            async with relay_running(contender, db, url, concurrency) as child:
                # An old snapshot and a transaction id, held while everything flows.
                await held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await held.fetchval("SELECT txid_current()")
                await held.fetchval("SELECT count(*) FROM outbox_messages")
                await offer(pool, messages, rate, Producer.of(contender))
                await wait_for(receiver, messages, within=120)
                await pool.close()
            # The relay and the producers have disconnected: their statistics are reported.
            await asyncio.sleep(1.5)
            after = await tables(conn)
            slot = await slot_state(conn) if contender in TAILERS else None
            await conn.execute("VACUUM outbox_messages")
            vacuumed = await tables(conn)
            await held.execute("ROLLBACK")
            counts = await done_counts(conn, contender)
        finally:
            await pool.close()
            await held.close()
            await conn.close()
    if counts != {"Processed": messages}:
        raise AssertionError(f"{contender}: recorded {counts}")
    result = {
        "contender": contender,
        "messages": messages,
        "rate": rate,
        "outbox_dead_tuples": after["outbox_messages"]["dead"],
        "outbox_dead_after_vacuum": vacuumed["outbox_messages"]["dead"],
        "tables": after,
        "slot_after": slot,
        "worker": relay_result(child),
    }
    log(f"logical held {contender}: {result}")
    return result


# --- order -----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def ordered_receiver() -> AsyncIterator[tuple[str, receiver_module.Recorder]]:
    """``bench.receiver`` in this process, so that the order of arrival can be read."""
    recorder = receiver_module.Recorder()
    ids = [0]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: receiver_module.Connection(recorder, ids), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook", recorder
    finally:
        server.close()
        await server.wait_closed()


async def crossed_pairs(db: Database, keys: int) -> list[tuple[str, str]]:
    """Per key, two transactions: A begins and inserts first, B after it and commits first.
    Returns (A's id, B's id): created_at (and the key's sequence) say A, B; the commits B, A."""
    first, second = await db.connect(), await db.connect()
    pairs = []
    try:
        for k in range(keys):
            key = f"order-{k}"
            async with first.transaction():
                a = await outbox.enqueue(first, EVENT_TYPE, payload(k), ordering_key=key)
                async with second.transaction():
                    b = await outbox.enqueue(second, EVENT_TYPE, payload(k), ordering_key=key)
            pairs.append((str(a), str(b)))
    finally:
        await first.close()
        await second.close()
    return pairs


async def order_once(contender: str, servers: Servers, keys: int) -> dict[str, Any]:
    async with Database(servers.logical, contender) as db, ordered_receiver() as (url, got):
        conn = await db.connect()
        try:
            if contender in TAILERS:
                await tailer.prepare(conn)
            pairs = await crossed_pairs(db, keys)
            created = await conn.fetch(
                "SELECT outbox_message_id::text AS id, created_at, ordering_seq"
                " FROM outbox_messages"
            )
        finally:
            await conn.close()
        check = {r["id"]: (r["created_at"], r["ordering_seq"]) for r in created}
        assert all(check[a] < check[b] for a, b in pairs), "A must be older than B"
        if contender in TAILERS:
            command = tailer_command(contender, db, url, 16, 2 * keys)
        else:
            relay = ["bench.worker", "relay", "--database-url", db.url, "--url", url]
            command = [sys.executable, "-m", *relay, "--messages", str(2 * keys)]
        process = await asyncio.create_subprocess_exec(
            *command, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        _, err = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{contender} failed:\n{err.decode()[-3000:]}")
    position = {webhook_id: i for i, webhook_id in enumerate(got.ids)}
    commit_order = sum(1 for a, b in pairs if position[b] < position[a])
    created_order = sum(1 for a, b in pairs if position[a] < position[b])
    result = {
        "contender": contender,
        "keys": keys,
        "commit_order": commit_order,
        "created_at_order": created_order,
    }
    log(f"logical order {contender}: {result}")
    return result
