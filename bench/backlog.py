"""A million-row backlog: the time one relay process takes to drain it, and the lease along the way.

``messages`` due rows (1M in the full run) are written straight into ``outbox_messages`` with
``generate_series`` (the producer API would take most of an hour to write as many; the rows are
those it writes: Pending, due, an order event of about 300 bytes each, created a millisecond
apart), then vacuumed, analysed and checkpointed. One relay process (``bench.worker relay``,
``Relay.open`` then ``execute()``, its defaults) drains them to the instant receiver.

Reported: the drain's seconds and rate (first lease to last outcome, by the database's clock),
the relay's CPU per message and peak RSS, the table's size before and after, and every lease
statement's duration as the server logged it (``log_min_duration_statement = 0``), as p50 / p99
/ max of the first, middle and last third of the drain's leases, so a lease that slows as the
backlog is worked through (the finished rows left behind, autovacuum being off on the
benchmark's server) shows. Each round is a fresh backlog.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import (
    CpuMeter,
    Database,
    ReceiverProcess,
    bench_server,
    log,
    median,
    outbox_counts,
    outbox_wall_seconds,
    percentile,
    settle,
)
from bench.dbcost import LEASE_STATEMENT, run, worker_command

CHUNK = 100_000
# What ``bench.common.payload(i)`` holds, built by the server.
FILL = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, next_attempt_at,
                             created_at)
SELECT gen_random_uuid(), 'OrderPlaced',
       jsonb_build_object(
           'orderId', g,
           'customerId', 'cus_' || lpad((g % 9973)::text, 6, '0'),
           'currency', 'EUR',
           'total', to_char((g % 500) + 19.99, 'FM999990.00'),
           'lines', jsonb_build_array(
               jsonb_build_object('sku', 'SKU-' || lpad((g % 1000)::text, 4, '0'),
                                  'quantity', 1, 'price', '4.50'),
               jsonb_build_object('sku', 'SKU-' || lpad(((g + 1) % 1000)::text, 4, '0'),
                                  'quantity', 2, 'price', '5.50'),
               jsonb_build_object('sku', 'SKU-' || lpad(((g + 2) % 1000)::text, 4, '0'),
                                  'quantity', 3, 'price', '6.50')),
           'placedAt', '2026-01-02T03:04:05.123456+00:00'),
       'Pending', now() - interval '1 hour',
       now() - interval '2 hours' + g * interval '1 microsecond'
FROM generate_series($1::bigint, $2::bigint) AS g
"""
TABLE_BYTES = "SELECT pg_total_relation_size('outbox_messages')"
PHASES = ("start", "middle", "end")


async def fill(conn: Any, messages: int) -> None:
    for first in range(1, messages + 1, CHUNK):
        await conn.execute(FILL, first, min(first + CHUNK - 1, messages))


def thirds(values: list[float]) -> dict[str, dict[str, float]]:
    """p50 / p99 / max in milliseconds of the first, middle and last third of ``values``."""
    size = max(1, len(values) // 3)
    parts = (values[:size], values[size : len(values) - size], values[len(values) - size :])
    return {
        name: {
            "leases": len(part),
            "p50_ms": round(percentile(part, 50) * 1000, 2),
            "p99_ms": round(percentile(part, 99) * 1000, 2),
            "max_ms": round(max(part, default=float("nan")) * 1000, 2),
        }
        for name, part in zip(PHASES, parts, strict=True)
    }


async def drain(receiver: ReceiverProcess, messages: int, concurrency: int) -> dict[str, Any]:
    await receiver.reset()
    server = bench_server()
    async with Database("backlog") as db:
        conn = await db.connect()
        try:
            await db.migrate()
            await fill(conn, messages)
            await settle(conn)
            size_before = await conn.fetchval(TABLE_BYTES)
            if server is not None:
                await conn.execute(f'ALTER DATABASE "{db.name}" SET log_min_duration_statement = 0')
                log_from = server.log_offset()
            meter = CpuMeter(receiver.pid)
            options = ("--messages", str(messages), "--lease-times")
            command = worker_command(db, receiver.url("/hook"), concurrency, *options)
            output = await asyncio.to_thread(run, command)
            cpu = meter.stop()
            counts = await outbox_counts(conn)
            wall = await outbox_wall_seconds(conn)
            size_after = await conn.fetchval(TABLE_BYTES)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if counts != {"Processed": messages} or stats.distinct != messages:
        raise AssertionError(f"backlog drain incomplete: {counts}, {stats.distinct} ids")
    leases = server.statement_seconds(log_from, LEASE_STATEMENT) if server else []
    timed_by = "server" if leases else "relay"
    leases = leases or output["lease_seconds"]
    return {
        "messages": messages,
        "seconds": round(wall, 2),
        "rate": round(messages / wall, 1),
        "relay_cpu_us_per_message": round(output["cpu_seconds"] / messages * 1e6, 1),
        "postgres_cpu_us_per_message": round(cpu["postgres"] / messages * 1e6, 1),
        "peak_rss_mb": output["peak_rss_mb"],
        "table_mb_before": round(size_before / 2**20, 1),
        "table_mb_after": round(size_after / 2**20, 1),
        "leases": len(leases),
        "lease_timed_by": timed_by,
        "lease_ms": thirds(leases),
        "lease_seen_by_relay_ms": thirds(output["lease_seconds"]),
    }


async def measure(
    receiver: ReceiverProcess, *, messages: int, runs: int, concurrency: int
) -> dict[str, Any]:
    rounds = []
    for round_ in range(1, runs + 1):
        result = await drain(receiver, messages, concurrency)
        log(f"backlog round {round_}: {result}")
        rounds.append(result)
    return {
        "messages": messages,
        "rounds": rounds,
        "seconds_median": median([r["seconds"] for r in rounds]),
        "rate_median": median([r["rate"] for r in rounds]),
        # The lease at the drain's end against its start, per round.
        "lease_p50_end_vs_start": median(
            [r["lease_ms"]["end"]["p50_ms"] / r["lease_ms"]["start"]["p50_ms"] for r in rounds]
        ),
    }
