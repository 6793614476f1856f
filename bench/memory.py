"""Memory: peak RSS of the relay process while it drains a large backlog in one ``execute()``."""

from __future__ import annotations

from typing import Any

from bench.common import Database, ReceiverProcess, log, median
from bench.throughput import Options, database_wall_seconds, run_worker


async def run_once(receiver: ReceiverProcess, messages: int, concurrency: int) -> dict[str, Any]:
    await receiver.reset()
    async with Database("memory") as db:
        await db.backlog(messages)
        worker = run_worker(
            "relay", receiver.url(), db.url, Options(messages=messages, concurrency=concurrency)
        )
        wall = await database_wall_seconds("relay", db, messages)
    stats = await receiver.stats()
    if stats.distinct != messages:
        raise AssertionError(f"memory: receiver saw {stats.distinct} of {messages} messages")
    result = {
        "messages": messages,
        "peak_rss_mb": worker["peak_rss_mb"],
        "rate": round(messages / wall, 1),
    }
    log(f"memory: {result}")
    return result


async def measure(
    receiver: ReceiverProcess, *, messages: int, runs: int, concurrency: int
) -> dict[str, Any]:
    results = [await run_once(receiver, messages, concurrency) for _ in range(runs)]
    return {
        "messages": messages,
        "runs": results,
        "peak_rss_mb_median": median([r["peak_rss_mb"] for r in results]),
    }
