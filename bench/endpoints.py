"""Many endpoints: 1,000 endpoints over 200 event types, traffic Zipf-distributed over the types.

Per round, a fresh backlog whose event types (``T0`` … ``T199``) are drawn from a Zipf law
(exponent 1.1: the first type gets about a fifth of the messages, most types a handful) is
drained by one relay process configured with five endpoints per type (``<receiver>/tN/eM``), to
the instant receiver. Reported: deliveries per second, the relay process's CPU per delivery and
its peak RSS; and, from one further drain under pyinstrument, the frames with the largest share
of the profile's own time, to see where the breaker and admission bookkeeping shows.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

import outbox
from bench.common import (
    ENQUEUE_CHUNK,
    Database,
    ReceiverProcess,
    log,
    median,
    outbox_counts,
    payload,
    settle,
)
from bench.dbcost import run, worker_command

ZIPF_EXPONENT = 1.1
TOP_FRAMES = 12


def event_types(messages: int, types: int, seed: int) -> list[str]:
    weights = [1 / (rank**ZIPF_EXPONENT) for rank in range(1, types + 1)]
    draw = random.Random(seed)
    return [f"T{t}" for t in draw.choices(range(types), weights=weights, k=messages)]


async def drain_many(
    receiver: ReceiverProcess,
    *,
    messages: int,
    types: int,
    per_type: int,
    concurrency: int,
    seed: int,
    profile: Path | None = None,
) -> dict[str, Any]:
    await receiver.reset()
    async with Database("endpoints") as db:
        conn = await db.connect()
        try:
            await db.migrate()
            drawn = event_types(messages, types, seed)
            for first in range(0, messages, ENQUEUE_CHUNK):
                async with conn.transaction():
                    for i in range(first, min(first + ENQUEUE_CHUNK, messages)):
                        await outbox.enqueue(conn, drawn[i], payload(i))
            await settle(conn)
            options = ["--messages", str(messages), "--event-types", str(types)]
            options += ["--endpoints", str(per_type)]
            if profile is not None:
                options += ["--profile", str(profile)]
            command = worker_command(db, receiver.url("/hook"), concurrency, *options)
            output = await asyncio.to_thread(run, command)
            counts = await outbox_counts(conn)
        finally:
            await conn.close()
    stats = await receiver.stats()
    deliveries = messages * per_type
    if counts != {"Processed": messages} or stats.requests < deliveries:
        raise AssertionError(f"drain incomplete: {counts}, receiver took {stats.requests}")
    return {
        "messages": messages,
        "deliveries": deliveries,
        "busiest_type_share": round(drawn.count("T0") / messages, 3),
        "types_seen": len(set(drawn)),
        "rate_deliveries": round(deliveries / output["wall_seconds"], 1),
        "relay_cpu_us_per_delivery": round(output["cpu_seconds"] / deliveries * 1e6, 1),
        "peak_rss_mb": output["peak_rss_mb"],
    }


def top_frames(text: str) -> list[str]:
    """The first lines of pyinstrument's flat text output (percent of total, own time)."""
    lines = [line.strip() for line in text.splitlines() if "%" in line]
    return lines[:TOP_FRAMES]


async def measure(
    receiver: ReceiverProcess,
    *,
    messages: int,
    types: int,
    per_type: int,
    runs: int,
    concurrency: int,
) -> dict[str, Any]:
    rounds = []
    for round_ in range(1, runs + 1):
        result = await drain_many(
            receiver,
            messages=messages,
            types=types,
            per_type=per_type,
            concurrency=concurrency,
            seed=round_,
        )
        log(f"many endpoints round {round_}: {result}")
        rounds.append(result)
    with tempfile.TemporaryDirectory(prefix="bench-endpoints-") as scratch:
        path = Path(scratch) / "profile.html"
        await drain_many(
            receiver,
            messages=messages,
            types=types,
            per_type=per_type,
            concurrency=concurrency,
            seed=0,
            profile=path,
        )
        frames = top_frames(Path(str(path) + ".txt").read_text(encoding="utf-8"))
    log("many endpoints profile:\n" + "\n".join(frames))

    def spread(key: str) -> dict[str, float]:
        values = [r[key] for r in rounds]
        return {"median": round(median(values), 1), "low": min(values), "high": max(values)}

    return {
        "messages": messages,
        "event_types": types,
        "endpoints": types * per_type,
        "zipf_exponent": ZIPF_EXPONENT,
        "rounds": rounds,
        "rate_deliveries": spread("rate_deliveries"),
        "relay_cpu_us_per_delivery": spread("relay_cpu_us_per_delivery"),
        "peak_rss_mb": spread("peak_rss_mb"),
        "profile_top_frames": frames,
    }
