"""The database's cost on one method: WAL per delivered message, the relay against pgqueuer.

    python -m bench.walcost [--messages 3000,30000] [--variants flow] [--rate 500]

The method the targets use (``flow``; docs/performance.md, "WAL per message"): per contender and
size, a fresh database on the benchmark's private server and the contender running as a service
(``bench.hosts``: ``outbox serve`` woken by the producers' NOTIFY, pgqueuer's worker by its own);
a ``CHECKPOINT``; then producers (``bench.offered``, ``CONNECTIONS`` connections) commit
``messages`` events one per transaction at ``rate`` a second while it delivers them; the window
ends when the database says every message is done. WAL per delivered message is every byte
written in the window ÷ messages: what the database writes to get a message from the producer's
commit to the receiver, the producer's own transaction included (each design asks something of
it). pg_walinspect splits it by the transaction that wrote it (``BY_WRITER``): the producers',
the relay's wake-up NOTIFYs (a commit record each), the consumer's, and records of no
transaction. No checkpoint falls inside (it is looked for, and reported): a page's full image is
written at its first change after a checkpoint, once per page whatever it holds, so where a
checkpoint falls decides a share of the bytes that neither contender chooses.

The variants, for the reconciliation of the earlier figures (docs/benchmarks/journal/): a
backlog of ``messages`` drained by the contender's worker process (``bench.worker``, the
throughput section's settings): ``cycle`` (one event per transaction, then the drain, no
checkpoint between), ``after_checkpoint`` (a CHECKPOINT between: every page the drain touches
writes its image, an upper bound) and ``batched`` (the throughput section exactly: 500 events per
transaction, VACUUM ANALYZE, CHECKPOINT, drain); each reports the enqueue's and the drain's WAL
apart. Payloads ``standard`` (the benchmark's ~300 B order) and ``small`` (``{"orderId": i}``).
Each run breaks its bytes down with pg_walinspect (``pg_get_wal_stats`` by record type,
``pg_get_wal_block_info`` by relation: records whose first block is the relation's, their bytes,
and the full-page images of its pages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg

import outbox
from bench import hosts
from bench.common import (
    EVENT_TYPE,
    ROOT,
    Database,
    ReceiverProcess,
    admin_dsn,
    body,
    enqueue_outbox,
    log,
    median,
    payload,
    settle,
)
from bench.server import wal_bytes, wal_lsn
from bench.throughput import (
    PGQ_ENTRYPOINT,
    Options,
    enqueue_pgqueuer,
    install_pgqueuer,
    run_worker,
)

CONTENDERS = ("relay", "pgqueuer")
METHOD = "flow"
VARIANTS = ("flow", "cycle", "after_checkpoint", "batched")
PAYLOADS = ("standard", "small")
# The flow's offered rate (msg/s): one this machine sustains beside the rest, shared, for both
# contenders; its leases are a few rows each.
RATE = 500.0
# Producers committing at once.
CONNECTIONS = 8
# The workers' settings in the backlog variants: the throughput section's.
CONCURRENCY = 16
PGQ_MAX_TASKS = 200
# How long the last outcomes (and pgqueuer's log aggregation, every 30 s) may take once the
# producers are done.
SETTLE_SECONDS = 90.0
SMOKE = {"walcost_messages": "300", "walcost_rounds": 1, "walcost_rate": 100.0}

BY_RECORD_TYPE = """
SELECT "resource_manager/record_type" AS kind, count, record_size, fpi_size, combined_size
FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn, true) WHERE count > 0
ORDER BY combined_size DESC
"""
# Records whose first block is a page of the relation (their bytes, images included), and the
# images written of its pages, in this database; the rest (commits, running transactions) have
# no block and are in the record types above.
BY_RELATION = """
WITH blocks AS (
    SELECT b.*, CASE WHEN reltablespace = d.dattablespace THEN 0 ELSE reltablespace END AS space
    FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn, false) b, pg_database d
    WHERE d.datname = current_database() AND b.reldatabase = d.oid
)
SELECT coalesce(pg_filenode_relation(space, relfilenode)::text, relfilenode::text)
         || CASE WHEN relforknumber = 0 THEN '' ELSE ' (fork ' || relforknumber || ')' END
         AS relation,
       count(*) FILTER (WHERE block_id = 0) AS records,
       coalesce(sum(record_length) FILTER (WHERE block_id = 0), 0) AS record_bytes,
       sum(block_fpi_length) AS fpi_bytes,
       count(*) FILTER (WHERE block_fpi_length > 0) AS images
FROM blocks GROUP BY 1 ORDER BY 3 DESC
"""
# Each WAL record by the transaction that wrote it: a producer's (it inserted into the queue
# table), a wake-up's (a transaction that wrote nothing but its commit: the relay's NOTIFY after
# the producer's commit), the consumer's (every other transaction), or none (xid 0: images for
# hint bits, running-transaction snapshots, page pruning).
BY_WRITER = """
WITH records AS (
    SELECT xid, record_length, resource_manager
    FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
),
producers AS (
    SELECT DISTINCT xid FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn, false)
    WHERE resource_manager = 'Heap' AND record_type LIKE 'INSERT%'
      AND relfilenode = pg_relation_filenode($3::regclass)
),
kinds AS (
    SELECT xid, CASE
        WHEN xid = 0 THEN 'none'
        WHEN xid IN (SELECT xid FROM producers) THEN 'producer'
        WHEN bool_and(resource_manager = 'Transaction') THEN 'wakeup'
        ELSE 'consumer' END AS writer
    FROM records GROUP BY xid
)
SELECT writer, sum(record_length)::bigint AS bytes
FROM records JOIN kinds USING (xid) GROUP BY writer
"""
CHECKPOINT_LSN = "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()"
QUEUE_TABLE = {"relay": "outbox_messages", "pgqueuer": "pgqueuer"}


@dataclass(frozen=True)
class Run:
    contender: str
    messages: int
    variant: str = METHOD
    payload: str = "standard"
    rate: float = RATE


def data(i: int, kind: str) -> dict[str, Any]:
    return payload(i) if kind == "standard" else {"orderId": i}


async def prepare(conn: Any, db: Database, run: Run) -> None:
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    if run.contender == "pgqueuer":
        await install_pgqueuer(conn)
    else:
        await db.migrate()
    await conn.execute("VACUUM ANALYZE")


async def measure_run(receiver: ReceiverProcess, run: Run) -> dict[str, Any]:
    """One run of ``run.variant``: its bytes per message and their breakdowns."""
    if run.variant == "batched" and run.payload != "standard":
        raise ValueError("the batched variant is the throughput section's: standard payloads")
    await receiver.reset()
    async with Database(f"wal_{run.contender}") as db:
        conn = await db.connect()
        try:
            await prepare(conn, db, run)
            measured = flow if run.variant == METHOD else backlog
            found = await measured(conn, db, run, receiver)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if stats.distinct != run.messages:
        raise AssertionError(f"walcost {run}: {stats.distinct} of {run.messages} arrived")
    result = {**asdict(run), **found}
    result["whole_life_bytes_per_msg"] = round(
        result["enqueued_bytes_per_msg"] + result["delivered_bytes_per_msg"], 1
    )
    log(
        f"walcost {run.contender} {run.messages:,} {run.variant} {run.payload}: per message "
        f"{result['whole_life_bytes_per_msg']:,} B, enqueued {result['enqueued_bytes_per_msg']:,}, "
        f"delivered {result['delivered_bytes_per_msg']:,} (images {result['fpi_bytes_per_msg']:,})"
    )
    return result


# -- the method: a steady flow ----------------------------------------------------------------


async def flow(conn: Any, db: Database, run: Run, receiver: ReceiverProcess) -> dict[str, Any]:
    hook = receiver.url("/hook")
    if run.contender == "pgqueuer":
        # Its log aggregation only when asked: measured apart below, not left to chance.
        service: hosts.Contender = hosts.PgqueuerService(db.url, hook, PGQ_MAX_TASKS, 0.0)
    else:
        service = hosts.ServeProcess(db.url, hook, "postgres")
    async with service:
        await conn.execute("CHECKPOINT")
        checkpoint, start = await conn.fetchval(CHECKPOINT_LSN), await wal_lsn(conn)
        await offer(service, db, run)
        await until_done(conn, run)
        end = await wal_lsn(conn)
        checkpoint_inside = await conn.fetchval(CHECKPOINT_LSN) != checkpoint
    writers = await bytes_by_writer(conn, start, end, QUEUE_TABLE[run.contender])
    per = {k: round(v / run.messages, 1) for k, v in writers.items()}
    total = await wal_bytes(conn, start, end)
    by_type = await breakdown(conn, BY_RECORD_TYPE, start, end)
    return {
        **await pgqueuer_aggregation(conn, run),
        "enqueued_bytes_per_msg": round(per.get("producer", 0) + per.get("wakeup", 0), 1),
        "delivered_bytes_per_msg": round(
            (total - writers.get("producer", 0) - writers.get("wakeup", 0)) / run.messages, 1
        ),
        "by_writer_per_msg": per,
        "fpi_bytes_per_msg": round(sum(r["fpi_size"] for r in by_type) / run.messages, 1),
        "checkpoint_inside": checkpoint_inside,
        "by_record_type": by_type,
        "by_relation": await breakdown(conn, BY_RELATION, start, end),
    }


async def pgqueuer_aggregation(conn: Any, run: Run) -> dict[str, float]:
    """pgqueuer's fold of the run's log rows into its statistics (an UPDATE of each, what its
    worker does every 30 s by default), by itself: WAL per message, outside the method's
    figure (which would otherwise count it or not by where its timer fell)."""
    if run.contender != "pgqueuer":
        return {}
    from pgqueuer import AsyncpgDriver, Queries

    start = await wal_lsn(conn)
    await Queries(AsyncpgDriver(conn)).aggregate_logs()
    written = await wal_bytes(conn, start, await wal_lsn(conn))
    return {"log_aggregation_bytes_per_msg": round(written / run.messages, 1)}


async def offer(service: Any, db: Database, run: Run) -> None:
    """``bench.offered``: ``run.messages`` one-event transactions at ``run.rate``."""
    kind = "pgqueuer" if run.contender == "pgqueuer" else "outbox"
    with tempfile.TemporaryDirectory(prefix="bench-walcost-") as folder:
        command = [
            *(sys.executable, "-m", "bench.offered", kind, "--database-url", db.url),
            *("--rate", str(run.rate), "--messages", str(run.messages)),
            *("--connections", str(CONNECTIONS), "--commits", f"{folder}/commits.csv"),
        ]
        env = {**hosts.clean_environment(), **service.producer_env}
        producer = await asyncio.create_subprocess_exec(
            *command, cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL
        )
        if await producer.wait() != 0:
            raise RuntimeError("walcost: the producer failed (its error is above)")


async def until_done(conn: Any, run: Run) -> None:
    """Until the database says every message is done: the relay's rows Processed (the outcome
    write is its last), pgqueuer's queue empty with each job's success logged."""
    if run.contender == "pgqueuer":
        query = (
            "SELECT (SELECT count(*) FROM pgqueuer) = 0 AND (SELECT count(*) FROM pgqueuer_log"
            " WHERE status = 'successful') = $1"
        )
    else:
        query = "SELECT count(*) = $1 FROM outbox_messages WHERE status = 'Processed'"
    deadline = time.monotonic() + run.messages / run.rate + SETTLE_SECONDS
    while not await conn.fetchval(query, run.messages):
        if time.monotonic() > deadline:
            raise AssertionError(f"walcost {run}: not every message done in time")
        await asyncio.sleep(0.2)


async def bytes_by_writer(conn: Any, start: str, end: str, queue_table: str) -> dict[str, int]:
    """WAL bytes between two LSNs by writer (``BY_WRITER``); empty where pg_walinspect cannot
    give it (before PostgreSQL 16)."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = await conn.fetch(BY_WRITER, start, end, queue_table)
    except (asyncpg.UndefinedFunctionError, asyncpg.UndefinedFileError):
        return {}
    return {row["writer"]: int(row["bytes"]) for row in rows}


# -- the backlog variants ---------------------------------------------------------------------


async def backlog(conn: Any, db: Database, run: Run, receiver: ReceiverProcess) -> dict[str, Any]:
    await conn.execute("CHECKPOINT")
    checkpoint, start = await conn.fetchval(CHECKPOINT_LSN), await wal_lsn(conn)
    await enqueue(conn, db, run)
    enqueued = await wal_lsn(conn)
    if run.variant == "batched":
        await settle(conn)  # VACUUM ANALYZE, CHECKPOINT: the throughput section's order
    elif run.variant == "after_checkpoint":
        await conn.execute("CHECKPOINT")
    inside = await conn.fetchval(CHECKPOINT_LSN) != checkpoint and run.variant == "cycle"
    drain_start = await wal_lsn(conn)
    options = Options(messages=run.messages, concurrency=CONCURRENCY, pgq_max_tasks=PGQ_MAX_TASKS)
    await asyncio.to_thread(run_worker, run.contender, receiver.url("/hook"), db.url, options)
    drained = await wal_lsn(conn)
    by_type = await breakdown(conn, BY_RECORD_TYPE, drain_start, drained)
    return {
        "enqueued_bytes_per_msg": round(await wal_bytes(conn, start, enqueued) / run.messages, 1),
        "delivered_bytes_per_msg": round(
            await wal_bytes(conn, drain_start, drained) / run.messages, 1
        ),
        "fpi_bytes_per_msg": round(sum(r["fpi_size"] for r in by_type) / run.messages, 1),
        "checkpoint_inside": inside,
        "by_record_type": by_type,
        "by_relation": await breakdown(conn, BY_RELATION, drain_start, drained),
        "enqueue_by_relation": await breakdown(conn, BY_RELATION, start, enqueued),
    }


async def enqueue(conn: Any, db: Database, run: Run) -> None:
    if run.variant != "batched":
        await enqueue_one_per_transaction(db, run)
    elif run.contender == "pgqueuer":
        await enqueue_pgqueuer(conn, run.messages)
    else:
        await enqueue_outbox(conn, run.messages)


async def enqueue_one_per_transaction(db: Database, run: Run) -> None:
    """``run.messages`` events, each committed alone, by ``CONNECTIONS`` connections at once."""
    from pgqueuer import AsyncpgDriver, Queries

    async def producer(first: int) -> None:
        conn = await db.connect()
        try:
            queries = Queries(AsyncpgDriver(conn))
            for i in range(first, run.messages, CONNECTIONS):
                if run.contender == "pgqueuer":
                    await queries.enqueue(PGQ_ENTRYPOINT, body(i, data=data(i, run.payload))[1], 0)
                else:
                    async with conn.transaction():
                        await outbox.enqueue(conn, EVENT_TYPE, data(i, run.payload))
        finally:
            await conn.close()

    await asyncio.gather(*(producer(first) for first in range(CONNECTIONS)))


async def breakdown(conn: Any, query: str, start: str, end: str) -> list[dict[str, Any]]:
    """The rows of a pg_walinspect query; none before PostgreSQL 16, which lacks
    ``pg_get_wal_block_info`` (a server named by ``OUTBOX_BENCH_ADMIN_DSN``)."""
    try:
        return [dict(row) for row in await conn.fetch(query, start, end)]
    except asyncpg.UndefinedFunctionError:
        return []


# -- rounds, ratios, the table ----------------------------------------------------------------


async def measure(
    receiver: ReceiverProcess,
    *,
    sizes: tuple[int, ...],
    variants: tuple[str, ...] = (METHOD,),
    payloads: tuple[str, ...] = ("standard",),
    rounds: int = 1,
    rate: float = RATE,
) -> dict[str, Any]:
    """Every contender at every size, variant and payload, ``rounds`` times, the contenders in
    a random order per round; relay ÷ pgqueuer per round."""
    runs = []
    order = random.Random()
    cells = [
        (messages, variant, kind)
        for messages in sizes
        for variant in variants
        for kind in payloads
        if variant in ("cycle", "after_checkpoint") or kind == "standard"
    ]
    for round_ in range(1, rounds + 1):
        for messages, variant, kind in cells:
            contenders = list(CONTENDERS)
            order.shuffle(contenders)
            for contender in contenders:
                run = Run(contender, messages, variant, kind, rate)
                runs.append({**await measure_run(receiver, run), "round": round_})
    return {"method": METHOD, "rate": rate, "runs": runs, "ratios": ratios(runs)}


FIGURES = ("whole_life", "delivered", "enqueued")


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size, variant and payload: relay ÷ pgqueuer per round (median and spread) of the
    bytes per message in the whole life, delivered and enqueued; and the median bytes."""
    pairs: dict[tuple[int, str, str], list[dict[str, dict[str, Any]]]] = {}
    by_round: dict[tuple[int, int, str, str], dict[str, dict[str, Any]]] = {}
    for run in runs:
        cell = (run["round"], run["messages"], run["variant"], run["payload"])
        by_round.setdefault(cell, {})[run["contender"]] = run
    for (_, messages, variant, kind), pair in by_round.items():
        if set(pair) == set(CONTENDERS):
            pairs.setdefault((messages, variant, kind), []).append(pair)
    rows = []
    for (messages, variant, kind), found in sorted(pairs.items()):
        row: dict[str, Any] = {"messages": messages, "variant": variant, "payload": kind}
        for figure in FIGURES:
            name = f"{figure}_bytes_per_msg"
            values = [p["relay"][name] / p["pgqueuer"][name] for p in found]
            row[f"{figure}_relay_vs_pgqueuer"] = spread(values)
            row[f"{figure}_bytes"] = {c: median([p[c][name] for p in found]) for c in CONTENDERS}
        rows.append(row)
    return rows


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(median(values), 3),
        "low": round(min(values), 3),
        "high": round(max(values), 3),
    }


def table_lines(section: dict[str, Any]) -> list[str]:
    lines = []
    for row in section["ratios"]:
        whole, delivered = row["whole_life_relay_vs_pgqueuer"], row["delivered_relay_vs_pgqueuer"]
        relay, pgq = row["whole_life_bytes"]["relay"], row["whole_life_bytes"]["pgqueuer"]
        lines.append(
            f"| WAL per delivered message, relay ÷ pgqueuer, {row['messages']:,} messages "
            f"({row['variant']}, {row['payload']} payload): whole life; the consumer's part | "
            f"{whole['median']:g} ({whole['low']:g} to {whole['high']:g}), {relay:,.0f} / "
            f"{pgq:,.0f} B; {delivered['median']:g} | |"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.walcost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--messages", default="3000,30000", help="sizes, comma-separated")
    parser.add_argument("--variants", default=METHOD, help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--payloads", default="standard", help=f"of {', '.join(PAYLOADS)}")
    parser.add_argument("--rate", type=float, default=RATE, help="the flow's msg/s")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output-json", type=Path)
    args = parser.parse_args(argv)
    admin_dsn()  # the private server, before the event loop

    async def run() -> dict[str, Any]:
        with ReceiverProcess() as receiver:
            return await measure(
                receiver,
                sizes=tuple(int(n) for n in args.messages.split(",")),
                variants=tuple(args.variants.split(",")),
                payloads=tuple(args.payloads.split(",")),
                rounds=args.rounds,
                rate=args.rate,
            )

    result = asyncio.run(run())
    if args.output_json:
        args.output_json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("\n".join(table_lines(result)))


if __name__ == "__main__":
    main()
