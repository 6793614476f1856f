"""What the relay costs the database it shares, as relays scale out and as endpoints fan out.

- Scale-out: one backlog drained by one relay process, then (a fresh copy) by ``relays`` relay
  processes racing over it, as Azure Functions scales the relay out to many instances. Per
  message: WAL bytes and PostgreSQL CPU; and every lease statement's duration, to compare the
  slowest lease of the racing relays with the single relay's median.
- Fan-out: the same backlog with one endpoint per event type, then with two; the database's cost
  per message-endpoint (per delivery) against the one-endpoint cost.

WAL and CPU are read on the benchmark's private server (``bench.server``), the schema created and
a CHECKPOINT taken before each drain, so every run starts from the same line.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from bench.common import (
    ROOT,
    CpuMeter,
    Database,
    ReceiverProcess,
    bench_server,
    enqueue_outbox,
    log,
    median,
    outbox_counts,
    settle,
)
from bench.server import wal_bytes, wal_lsn
from outbox.store import QUERIES

# How the lease statement's text begins, to find its executions in the server's log.
LEASE_STATEMENT = QUERIES["lease_batch"][:40]


def worker_command(db: Database, url: str, concurrency: int, *options: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.worker",
        "relay",
        "--database-url",
        db.url,
        "--url",
        url,
        "--concurrency",
        str(concurrency),
        *options,
    ]


async def drain_with(
    receiver: ReceiverProcess,
    messages: int,
    *,
    relays: int = 1,
    endpoints: int = 1,
    concurrency: int = 16,
    drop_indexes: tuple[str, ...] = (),
    create_indexes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A fresh backlog of ``messages`` drained by ``relays`` processes at once (without the
    indexes ``drop_indexes`` and with ``create_indexes``' statements: what an index costs)."""
    await receiver.reset()
    async with Database("dbcost") as db:
        conn = await db.connect()
        try:
            await db.migrate()
            for index in drop_indexes:
                await conn.execute(f'DROP INDEX "{index}"')
            for statement in create_indexes:
                await conn.execute(statement)
            enqueue_start = await wal_lsn(conn)
            await enqueue_outbox(conn, messages)
            enqueued = await wal_bytes(conn, enqueue_start, await wal_lsn(conn))
            await settle(conn)
            server = bench_server()
            if server is not None:
                # Every statement's execution time in the server's log, for the leases.
                await conn.execute(f'ALTER DATABASE "{db.name}" SET log_min_duration_statement = 0')
                log_from = server.log_offset()
            start = await wal_lsn(conn)
            meter = CpuMeter(receiver.pid)
            options = ["--messages", str(messages), "--lease-times", "--endpoints", str(endpoints)]
            if relays > 1:
                options.append("--shared")
            url = receiver.url("/hook")
            outputs = await asyncio.gather(
                *(
                    asyncio.to_thread(run, worker_command(db, url, concurrency, *options))
                    for _ in range(relays)
                )
            )
            cpu = meter.stop()
            written = await wal_bytes(conn, start, await wal_lsn(conn))
            counts = await outbox_counts(conn)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if counts != {"Processed": messages} or stats.distinct != messages:
        raise AssertionError(f"drain incomplete: {counts}, receiver saw {stats.distinct} ids")
    # The server's own execution times where its log has them; else as each relay saw them
    # (which adds the time its event loop took to get back to the answer).
    client_leases = [d for output in outputs for d in output["lease_seconds"]]
    leases = server.statement_seconds(log_from, LEASE_STATEMENT) if server else []
    timed_by = "server" if leases else "relay"
    leases = leases or client_leases
    deliveries = messages * endpoints
    return {
        "relays": relays,
        "endpoints": endpoints,
        "messages": messages,
        "requests": stats.requests,
        "wal_bytes_per_message": round(written / messages, 1),
        "enqueue_wal_bytes_per_message": round(enqueued / messages, 1),
        "wal_bytes_per_delivery": round(written / deliveries, 1),
        "postgres_cpu_us_per_message": round(cpu["postgres"] / messages * 1e6, 1),
        "postgres_cpu_us_per_delivery": round(cpu["postgres"] / deliveries * 1e6, 1),
        "leases": len(leases),
        "lease_timed_by": timed_by,
        "lease_median_ms": round(median(leases) * 1000, 2),
        "lease_max_ms": round(max(leases) * 1000, 2),
        "lease_seen_by_relay_median_ms": round(median(client_leases) * 1000, 2),
        "lease_seen_by_relay_max_ms": round(max(client_leases) * 1000, 2),
        "processed_by_relay": [output["summary"]["processed"] for output in outputs],
    }


def run(command: list[str]) -> dict[str, Any]:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"relay worker failed:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _describe(run_: dict[str, Any]) -> str:
    return (
        f"{run_['relays']} relay(s), {run_['endpoints']} endpoint(s): "
        f"WAL {run_['wal_bytes_per_message']:,.0f} B/msg, "
        f"PostgreSQL CPU {run_['postgres_cpu_us_per_message']:,.0f} µs/msg, "
        f"lease median {run_['lease_median_ms']:.1f} ms, slowest {run_['lease_max_ms']:.1f} ms"
    )


async def measure_scaleout(
    receiver: ReceiverProcess, *, messages: int, relays: int, runs: int, concurrency: int
) -> dict[str, Any]:
    """``runs`` pairs (one relay, then ``relays`` racing), interleaved against drift."""
    single, racing = [], []
    for n in range(1, runs + 1):
        for group, count in ((single, 1), (racing, relays)):
            result = await drain_with(receiver, messages, relays=count, concurrency=concurrency)
            group.append(result)
            log(f"scale-out run {n}: {_describe(result)}")
    return {
        "messages": messages,
        "relays": relays,
        "single": single,
        "racing": racing,
        "wal_ratio": _ratio(racing, single, "wal_bytes_per_message"),
        "postgres_cpu_ratio": _ratio(racing, single, "postgres_cpu_us_per_message"),
        # The slowest lease among the racing relays against the single relay's median lease.
        "slowest_lease_ratio": round(
            median([r["lease_max_ms"] for r in racing])
            / median([r["lease_median_ms"] for r in single]),
            2,
        ),
    }


async def measure_fanout(
    receiver: ReceiverProcess, *, messages: int, runs: int, concurrency: int
) -> dict[str, Any]:
    """``runs`` pairs (one endpoint, then two per event type), interleaved against drift."""
    one, two = [], []
    for n in range(1, runs + 1):
        for group, endpoints in ((one, 1), (two, 2)):
            result = await drain_with(
                receiver, messages, endpoints=endpoints, concurrency=concurrency
            )
            group.append(result)
            log(f"fan-out run {n}: {_describe(result)}")
    return {
        "messages": messages,
        "one_endpoint": one,
        "two_endpoints": two,
        # Per delivery (message-endpoint) with two endpoints, against one endpoint's per message.
        "wal_per_delivery_ratio": round(
            median([r["wal_bytes_per_delivery"] for r in two])
            / median([r["wal_bytes_per_delivery"] for r in one]),
            3,
        ),
        "postgres_cpu_per_delivery_ratio": round(
            median([r["postgres_cpu_us_per_delivery"] for r in two])
            / median([r["postgres_cpu_us_per_delivery"] for r in one]),
            3,
        ),
    }


def _ratio(numerator: list[dict[str, Any]], denominator: list[dict[str, Any]], key: str) -> float:
    return round(median([r[key] for r in numerator]) / median([r[key] for r in denominator]), 3)
