"""Throughput: the same messages drained by each contender to the same receiver, round-robin.

Each run gets a fresh database, is filled before the clock starts (the relay's rows through
``outbox.enqueue``; pgqueuer's jobs through its ``Queries.enqueue``), vacuumed and analysed, then
drained by ``bench.worker`` in a process of its own. Every run is checked: the receiver must have
seen every message id, and the database must say every message was done.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import (
    ROOT,
    CpuMeter,
    Database,
    ReceiverProcess,
    body,
    chunks,
    enqueue_outbox,
    log,
    outbox_counts,
    outbox_wall_seconds,
    settle,
)

# "untraced": the relay with its telemetry calls taken out, for what they cost with no SDK.
CONTENDERS = ("raw", "relay", "untraced", "pgqueuer", "seed")
PGQ_ENTRYPOINT = "webhook"


@dataclass(frozen=True)
class Options:
    messages: int
    concurrency: int
    batch_size: int = 100
    pgq_max_tasks: int = 0
    pgq_entrypoint_limit: int = 0
    profile_dir: str | None = None


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


async def prepare(contender: str, db: Database, messages: int) -> None:
    conn = await db.connect()
    try:
        if contender in ("relay", "untraced", "seed"):
            await db.migrate()
            await enqueue_outbox(conn, messages)
        elif contender == "pgqueuer":
            await enqueue_pgqueuer(conn, messages)
        await settle(conn)
    finally:
        await conn.close()


async def enqueue_pgqueuer(conn: Any, messages: int) -> None:
    """pgqueuer's schema (its own installer) and one job per message, the body as payload."""
    from pgqueuer import AsyncpgDriver, Queries

    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
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
    contender: str, round_: int, receiver: ReceiverProcess, options: Options
) -> RunResult:
    await receiver.reset()
    async with Database(contender) as db:
        if contender != "raw":
            await prepare(contender, db, options.messages)
        meter = CpuMeter(receiver.pid)
        worker = run_worker(contender, receiver.url(), db.url, options)
        cpu = {"worker": worker["cpu_seconds"], **meter.stop()}
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
    )
    log(
        f"throughput {contender} round {round_}: {result.rate:,.0f} msg/s "
        f"({wall:.2f} s, peak RSS {result.peak_rss_mb:.0f} MB, CPU s {cpu})"
    )
    return result


async def measure(
    receiver: ReceiverProcess, options: Options, rounds: int, contenders: tuple[str, ...]
) -> list[dict[str, Any]]:
    """``rounds`` rounds, each running every contender once (interleaved against drift)."""
    results = []
    for round_ in range(1, rounds + 1):
        for contender in contenders:
            results.append(asdict(await run_one(contender, round_, receiver, options)))
    return results
