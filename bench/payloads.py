"""Payload sizes: the relay's rate, its CPU and the database's WAL per message as payloads grow.

Per round, in an order drawn at random, a fresh backlog of messages whose payload serialises to
1 KB, 16 KB, 64 KB and ``OUTBOX_MAX_PAYLOAD_BYTES`` (its default, 1 MiB) is enqueued through
the producer API and drained by one relay process (``bench.worker relay``) to the instant
receiver. Per size: messages per second, the relay process's CPU per message, and WAL bytes per
message, written by the enqueue and by the drain (read as in ``bench.dbcost``: the server's
WAL position before and after, a CHECKPOINT before the drain). The largest size drains fewer
messages (``max_messages``) so a run stays within memory and minutes.
"""

from __future__ import annotations

import asyncio
import base64
import random
from typing import Any

import outbox
from bench.common import (
    ENQUEUE_CHUNK,
    EVENT_TYPE,
    Database,
    ReceiverProcess,
    log,
    median,
    outbox_counts,
    settle,
)
from bench.dbcost import run, worker_command
from bench.server import wal_bytes, wal_lsn
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.producer.core import serialise_payload

SIZES = {"1KB": 1024, "16KB": 16 * 1024, "64KB": 64 * 1024, "max": DEFAULT_MAX_PAYLOAD_BYTES}


def sized_payload(i: int, size: int) -> dict[str, Any]:
    """An object whose JSON text, as the producer stores it, is exactly ``size`` bytes; its
    padding is random base64, which PostgreSQL's compression of large values cannot shrink."""
    bare = {"orderId": i, "pad": ""}
    padding = size - len(serialise_payload(bare).encode())
    noise = base64.b64encode(random.Random(i).randbytes(padding)).decode()[:padding]
    value = {"orderId": i, "pad": noise}
    assert len(serialise_payload(value).encode()) == size
    return value


async def drain_sized(
    receiver: ReceiverProcess, size: int, messages: int, concurrency: int
) -> dict[str, Any]:
    await receiver.reset()
    async with Database("payload") as db:
        conn = await db.connect()
        try:
            await db.migrate()
            before_enqueue = await wal_lsn(conn)
            chunk = max(1, min(ENQUEUE_CHUNK, (8 << 20) // size))
            for first in range(0, messages, chunk):
                async with conn.transaction():
                    for i in range(first, min(first + chunk, messages)):
                        await outbox.enqueue(conn, EVENT_TYPE, sized_payload(i, size))
            enqueued = await wal_bytes(conn, before_enqueue, await wal_lsn(conn))
            await settle(conn)
            start = await wal_lsn(conn)
            command = worker_command(
                db, receiver.url("/hook"), concurrency, "--messages", str(messages)
            )
            output = await asyncio.to_thread(run, command)
            drained = await wal_bytes(conn, start, await wal_lsn(conn))
            counts = await outbox_counts(conn)
        finally:
            await conn.close()
    stats = await receiver.stats()
    if counts != {"Processed": messages} or stats.distinct != messages:
        raise AssertionError(f"drain incomplete: {counts}, receiver saw {stats.distinct} ids")
    return {
        "messages": messages,
        "rate": round(messages / output["wall_seconds"], 1),
        "relay_cpu_us_per_message": round(output["cpu_seconds"] / messages * 1e6, 1),
        "wal_enqueue_bytes_per_message": round(enqueued / messages, 1),
        "wal_drain_bytes_per_message": round(drained / messages, 1),
    }


async def measure(
    receiver: ReceiverProcess,
    *,
    messages: int,
    max_messages: int,
    runs: int,
    concurrency: int,
    seed: int | None = None,
) -> dict[str, Any]:
    order = random.Random(seed)
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_ in range(1, runs + 1):
        names = list(SIZES)
        order.shuffle(names)
        results: dict[str, dict[str, Any]] = {}
        for name in names:
            count = max_messages if name == "max" else messages
            results[name] = await drain_sized(receiver, SIZES[name], count, concurrency)
        log(f"payload sizes round {round_} ({', '.join(names)}): {results}")
        rounds.append(results)
    return summarise(rounds, messages, max_messages)


def _spread(values: list[float], digits: int = 1) -> dict[str, float]:
    low, high = min(values), max(values)
    return {
        "median": round(median(values), digits),
        "low": round(low, digits),
        "high": round(high, digits),
    }


def summarise(
    rounds: list[dict[str, dict[str, Any]]], messages: int, max_messages: int
) -> dict[str, Any]:
    keys = (
        "rate",
        "relay_cpu_us_per_message",
        "wal_enqueue_bytes_per_message",
        "wal_drain_bytes_per_message",
    )
    return {
        "sizes": dict(SIZES),
        "messages": messages,
        "max_messages": max_messages,
        "rounds": rounds,
        "median": {
            name: {key: _spread([r[name][key] for r in rounds]) for key in keys} for name in SIZES
        },
        # Per round, each size's rate against 1 KB's in the same round.
        "rate_vs_1kb": {
            name: _spread([r[name]["rate"] / r["1KB"]["rate"] for r in rounds], 3)
            for name in SIZES
            if name != "1KB"
        },
    }
