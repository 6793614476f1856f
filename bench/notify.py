"""Producer commit throughput with a PostgreSQL wake-up (OUTBOX_WAKEUP=postgres), three ways.

``python -m bench.notify [--producers 32] [--seconds 10] [--runs 3]``: ``producers`` connections
each commit one-message transactions (``outbox.enqueue``) as fast as they can for ``seconds``,

- ``none``: no wake-up at all;
- ``random-ids``: no wake-up, and each message's id a random UUID (version 4) the caller gives,
  as every generated id was before they were time-ordered (``outbox/core/ids.py``);
- ``in-transaction``: ``NOTIFY`` inside the business transaction (delivered only on commit; the
  commit takes a cluster-wide lock to queue the notification);
- ``after-commit``: what ``outbox.transaction`` does with ``OUTBOX_WAKEUP=postgres``: the NOTIFY
  on the same connection after the commit, in a transaction of its own (lost if the process dies
  between the two, as a queue hint would be);

with one connection LISTENing in another process, as ``outbox serve`` does. Prints commits per
second per variant (median of ``runs``), each run's, and time-ordered ids ÷ random ones
(``none`` ÷ ``random-ids``): the median of the runs' ratios and their range.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

import outbox
from bench.common import Database, admin_dsn
from outbox.core.settings import WAKEUP_CHANNEL

VARIANTS = ("none", "random-ids", "in-transaction", "after-commit")
NOTIFY = f"SELECT pg_notify('{WAKEUP_CHANNEL}', '')"


async def producer(conn: Any, variant: str, until: float) -> int:
    commits = 0
    while time.monotonic() < until:
        if variant == "after-commit":
            async with outbox.transaction(conn) as tx:
                await tx.enqueue("OrderCompleted", {"orderId": commits})
        else:
            async with conn.transaction():
                given = uuid.uuid4() if variant == "random-ids" else None
                await outbox.enqueue(conn, "OrderCompleted", {"orderId": commits}, message_id=given)
                if variant == "in-transaction":
                    await conn.execute(NOTIFY)
        commits += 1
    return commits


LISTENER = """
import asyncio, sys, asyncpg
async def main():
    conn = await asyncpg.connect(sys.argv[1])
    await conn.add_listener(sys.argv[2], lambda *_: None)
    print("listening", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def one_run(db: Database, variant: str, producers: int, seconds: float) -> float:
    # The LISTENing side in a process of its own, as ``outbox serve`` is.
    listener = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LISTENER, db.url, WAKEUP_CHANNEL, stdout=asyncio.subprocess.PIPE
    )
    assert listener.stdout is not None
    await listener.stdout.readline()
    conns = [await db.connect() for _ in range(producers)]
    os.environ["OUTBOX_WAKEUP"] = "postgres"
    try:
        until = time.monotonic() + seconds
        counts = await asyncio.gather(*(producer(c, variant, until) for c in conns))
    finally:
        for conn in conns:
            await conn.close()
        listener.kill()
        await listener.wait()
    return sum(counts) / seconds


async def measure(producers: int, seconds: float, runs: int) -> dict[str, list[float]]:
    """Commits per second of each variant, run by run."""
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    async with Database("notify") as db:
        await db.migrate()
        for _ in range(runs):
            for variant in VARIANTS:  # interleaved: a drift of the machine hits each alike
                results[variant].append(await one_run(db, variant, producers, seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.notify", description=__doc__)
    parser.add_argument("--producers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    admin_dsn()  # the benchmark's own server, started before the event loop runs
    runs = asyncio.run(measure(args.producers, args.seconds, args.runs))
    figures = {v: round(statistics.median(r)) for v, r in runs.items()}
    # Time-ordered ids against random ones, run by run (the runs interleave the variants).
    ratios = [a / b for a, b in zip(runs["none"], runs["random-ids"], strict=True)]
    print(
        json.dumps(
            {
                "producers": args.producers,
                "commits_per_second": figures,
                "runs": {v: [round(x) for x in r] for v, r in runs.items()},
                "time_ordered_vs_random_ids": {
                    "median": round(statistics.median(ratios), 3),
                    "min": round(min(ratios), 3),
                    "max": round(max(ratios), 3),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
