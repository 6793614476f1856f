"""Throughput: the same messages drained by each contender to the same receiver, round-robin.

Each run gets a fresh database, is filled before the clock starts (the relay's rows through
``outbox.enqueue``; pgqueuer's jobs through its ``Queries.enqueue``), vacuumed and analysed, then
drained by ``bench.worker`` in a process of its own. Every run is checked: the receiver must have
seen every message id, and the database must say every message was done.

Each run also reports the WAL its enqueue and its drain wrote (``pg_current_wal_insert_lsn()``
deltas, the schema created and a CHECKPOINT taken before each), and PostgreSQL's CPU during the
drain: exact on the benchmark's private server (``bench.server``). For the relay's contenders,
the drain's WAL by record type (``pg_waldump --stats=record``) comes with it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import (
    ROOT,
    CpuMeter,
    Database,
    ReceiverProcess,
    bench_server,
    body,
    chunks,
    enqueue_outbox,
    log,
    outbox_counts,
    outbox_steady_rate,
    outbox_wall_seconds,
    settle,
)
from bench.server import wal_bytes, wal_lsn

# "untraced": the relay with its telemetry calls taken out, for what they cost with no SDK;
# "floor": only what any relay must do (lease, build, sign, POST, record), for the relay's overhead.
CONTENDERS = ("raw", "floor", "relay", "untraced", "pgqueuer", "seed")
PGQ_ENTRYPOINT = "webhook"


@dataclass(frozen=True)
class Options:
    messages: int
    concurrency: int
    batch_size: int = 100
    pgq_max_tasks: int = 0
    pgq_entrypoint_limit: int = 0
    profile_dir: str | None = None
    path: str = "/hook"  # the receiver's path: ``/slow/100`` for a receiver taking 100 ms


@dataclass
class RunResult:
    contender: str
    round: int
    messages: int
    wall_seconds: float
    rate: float
    worker_wall_seconds: float | None
    peak_rss_mb: float
    requests: int
    distinct: int
    cpu_seconds: dict[str, float]
    # WAL bytes the enqueue and the drain wrote; the drain's by record type (relay only).
    wal_bytes: dict[str, int]
    wal_record_types: dict[str, dict[str, int]] | None = None
    # Messages per second in the drain's middle 80 % (``outbox_steady_rate``; outbox contenders).
    steady_rate: float | None = None


def run_worker(contender: str, url: str, database_url: str, options: Options) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "bench.worker",
        contender,
        "--database-url",
        database_url,
        "--url",
        url,
        "--messages",
        str(options.messages),
        "--concurrency",
        str(options.concurrency),
        "--batch-size",
        str(options.batch_size),
        "--pgq-max-tasks",
        str(options.pgq_max_tasks),
        "--pgq-entrypoint-limit",
        str(options.pgq_entrypoint_limit),
    ]
    if options.profile_dir:
        command += ["--profile", f"{options.profile_dir}/{contender}.html"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{contender} worker failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


OUTBOX_CONTENDERS = ("floor", "relay", "untraced", "seed")


# What runs in a contender's database once its schema is made, before its messages are enqueued
# (``bench.slow``: a relay process before the measured one).
BeforeEnqueue = Callable[[Database], Awaitable[None]]


async def prepare(
    contender: str, db: Database, messages: int, before_enqueue: BeforeEnqueue | None = None
) -> int:
    """Create the contender's schema, then enqueue ``messages``; the WAL bytes of the enqueue."""
    conn = await db.connect()
    try:
        if contender in OUTBOX_CONTENDERS:
            await db.migrate()
        elif contender == "pgqueuer":
            await install_pgqueuer(conn)
        if before_enqueue is not None:
            await before_enqueue(db)
        await conn.execute("CHECKPOINT")
        start = await wal_lsn(conn)
        if contender in OUTBOX_CONTENDERS:
            await enqueue_outbox(conn, messages)
        elif contender == "pgqueuer":
            await enqueue_pgqueuer(conn, messages)
        written = await wal_bytes(conn, start, await wal_lsn(conn))
        await settle(conn)
        return written
    finally:
        await conn.close()


async def install_pgqueuer(conn: Any) -> None:
    """pgqueuer's schema, by its own installer."""
    from pgqueuer import AsyncpgDriver, Queries

    await Queries(AsyncpgDriver(conn)).install()


async def enqueue_pgqueuer(conn: Any, messages: int) -> None:
    """One pgqueuer job per message, the body as payload."""
    from pgqueuer import AsyncpgDriver, Queries

    queries = Queries(AsyncpgDriver(conn))
    for part in chunks([body(i)[1] for i in range(messages)], 500):
        await queries.enqueue([PGQ_ENTRYPOINT] * len(part), list(part), [0] * len(part))


async def database_wall_seconds(contender: str, db: Database, messages: int) -> float:
    """Check the database says every message is done; first claim to last outcome, by its clock."""
    conn = await db.connect()
    try:
        if contender == "pgqueuer":
            left = await conn.fetchval("SELECT count(*) FROM pgqueuer")
            done = await conn.fetchval(
                "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            )
            if left or done != messages:
                raise AssertionError(f"pgqueuer: {left} jobs left, {done} successful")
            return float(
                await conn.fetchval(
                    "SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')"
                    " - min(created) FILTER (WHERE status = 'picked'))::float8 FROM pgqueuer_log"
                )
            )
        counts = await outbox_counts(conn)
        if counts != {"Processed": messages}:
            raise AssertionError(f"{contender}: rows by status {counts}")
        return await outbox_wall_seconds(conn)
    finally:
        await conn.close()


async def run_one(
    contender: str,
    round_: int,
    receiver: ReceiverProcess,
    options: Options,
    before_enqueue: BeforeEnqueue | None = None,
) -> RunResult:
    await receiver.reset()
    wal = {"enqueue": 0, "drain": 0}
    record_types = None
    steady = None
    async with Database(contender) as db:
        if contender != "raw":
            wal["enqueue"] = await prepare(contender, db, options.messages, before_enqueue)
        conn = await db.connect()
        try:
            start = await wal_lsn(conn)
            meter = CpuMeter(receiver.pid)
            worker = run_worker(contender, receiver.url(options.path), db.url, options)
            cpu = {"worker": worker["cpu_seconds"], **meter.stop()}
            end = await wal_lsn(conn)
            wal["drain"] = await wal_bytes(conn, start, end)
            if contender in OUTBOX_CONTENDERS:
                steady = round(await outbox_steady_rate(conn), 1)
        finally:
            await conn.close()
        if contender != "raw":
            server = bench_server()
            if contender in OUTBOX_CONTENDERS and server is not None:
                record_types = server.wal_stats(start, end)
        stats = await receiver.stats()
        if stats.distinct != options.messages:
            raise AssertionError(
                f"{contender}: receiver saw {stats.distinct} distinct ids, "
                f"expected {options.messages}"
            )
        if contender == "raw":
            wall = float(worker["wall_seconds"])
        else:
            wall = await database_wall_seconds(contender, db, options.messages)
    result = RunResult(
        contender=contender,
        round=round_,
        messages=options.messages,
        wall_seconds=round(wall, 4),
        rate=round(options.messages / wall, 1),
        worker_wall_seconds=worker.get("wall_seconds"),
        peak_rss_mb=worker["peak_rss_mb"],
        requests=stats.requests,
        distinct=stats.distinct,
        cpu_seconds=cpu,
        wal_bytes=wal,
        wal_record_types=record_types,
        steady_rate=steady,
    )
    log(
        f"throughput {contender} round {round_}: {result.rate:,.0f} msg/s "
        f"({wall:.2f} s, peak RSS {result.peak_rss_mb:.0f} MB, CPU s {cpu}, WAL B/msg "
        f"{wal['enqueue'] / options.messages:,.0f} enqueue, {wal['drain'] / options.messages:,.0f} "
        "drain)"
    )
    return result


async def measure(
    receiver: ReceiverProcess, options: Options, rounds: int, contenders: tuple[str, ...]
) -> list[dict[str, Any]]:
    """``rounds`` rounds, each running every contender once (interleaved against drift), in an
    order drawn at random per round (no contender always runs first, after the fresh server)."""
    results = []
    order = random.Random()
    for round_ in range(1, rounds + 1):
        shuffled = list(contenders)
        order.shuffle(shuffled)
        log(f"throughput round {round_}: {', '.join(shuffled)}")
        for contender in shuffled:
            results.append(asdict(await run_one(contender, round_, receiver, options)))
    return results
