"""Cold against warm: a fresh process's drain against the same drain by a process that has
already delivered to the receiver.

Per round, one fresh database and one receiver answering after a lognormal ~100 ms
(``/lognormal/100``, where a process's limit of requests in flight per endpoint matters), with
the relay's default ``OUTBOX_CONCURRENCY``:

1. a relay process (``python -m bench.coldwarm worker``: ``Relay.open`` once, a drain
   (``execute()``) each time it reads ``go``) drains a backlog of ``messages``: a cold drain in a
   database no relay has used (``first``);
2. another backlog, drained by the same process: ``warm``;
3. another backlog, drained by a new process: ``cold``, in a database relays have used (what a
   new Functions instance meets: whatever the database keeps of the endpoint, none of the
   process's own state).

Each drain's rate is its messages ÷ first lease to last outcome, by the database's clock (its
rows only). Reported per round: ``cold ÷ warm`` and ``first ÷ warm`` (median and spread), and
the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from bench.common import (
    ROOT,
    Database,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    relay_settings,
    settle,
)
from outbox.core.settings import default_concurrency

PATH = "/lognormal/100"
SMOKE = {"coldwarm_messages": 300, "coldwarm_rounds": 1}
# First lease to last outcome of the rows created after a moment, by the database's clock.
DRAIN_SECONDS = """
SELECT count(*) AS n,
       extract(epoch FROM max(processed_at) - min(processing_started_at))::float8 AS seconds
FROM outbox_messages WHERE created_at > $1 AND status = 'Processed'
"""


class Worker:
    """``python -m bench.coldwarm worker``: a relay process that drains at each ``go``."""

    def __init__(self, db: Database, url: str) -> None:
        self.command = [
            *(sys.executable, "-m", "bench.coldwarm", "worker"),
            *("--database-url", db.url, "--url", url),
        ]
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Worker:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        return self

    async def drain(self) -> dict[str, Any]:
        assert self.process is not None
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("the cold/warm worker exited (its error is above)")
        found: dict[str, Any] = json.loads(line)
        return found

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


async def backlog(db: Database, messages: int, start: int) -> Any:
    """``messages`` more events, settled; the database's time before they were made."""
    conn = await db.connect()
    try:
        marker = await conn.fetchval("SELECT clock_timestamp()")
        await enqueue_outbox(conn, messages, start=start)
        await settle(conn)
        return marker
    finally:
        await conn.close()


async def drain_rate(db: Database, marker: Any, messages: int) -> float:
    conn = await db.connect()
    try:
        row = await conn.fetchrow(DRAIN_SECONDS, marker)
    finally:
        await conn.close()
    if row["n"] != messages:
        raise AssertionError(f"cold/warm: {row['n']} of {messages} messages processed")
    return round(messages / row["seconds"], 1) if row["seconds"] else 0.0


async def one_round(receiver: ReceiverProcess, messages: int) -> dict[str, float]:
    rates = {}
    url = receiver.url(PATH)
    async with Database("coldwarm") as db:
        await db.migrate()
        async with Worker(db, url) as warm:
            for name, start in (("first", 0), ("warm", messages)):
                marker = await backlog(db, messages, start)
                await warm.drain()
                rates[name] = await drain_rate(db, marker, messages)
        marker = await backlog(db, messages, 2 * messages)
        async with Worker(db, url) as cold:
            await cold.drain()
        rates["cold"] = await drain_rate(db, marker, messages)
    return rates


async def measure(receiver: ReceiverProcess, *, messages: int, rounds: int) -> dict[str, Any]:
    found = []
    for round_ in range(1, rounds + 1):
        await receiver.reset()
        rates = await one_round(receiver, messages)
        log(f"cold/warm round {round_}: msg/s {rates}")
        found.append(rates)
    ratios = {name: [r[name] / r["warm"] for r in found if r["warm"]] for name in ("cold", "first")}
    return {
        "messages": messages,
        "receiver": PATH,
        "concurrency": default_concurrency(),
        "rounds": found,
        "median_rate": {n: median([r[n] for r in found]) for n in ("first", "warm", "cold")},
        **{
            f"{name}_vs_warm": {
                "median": round(median(values), 3),
                "low": round(min(values), 3),
                "high": round(max(values), 3),
            }
            for name, values in ratios.items()
        },
    }


def table_lines(section: dict[str, Any]) -> list[str]:
    rates = section["median_rate"]
    lines = []
    for name, what in (("cold", "a new process"), ("first", "a new process, new database")):
        ratio = section[f"{name}_vs_warm"]
        lines.append(
            f"| {section['messages']:,} messages to a lognormal ~100 ms receiver: {what} ÷ a "
            f"warm one, per round | {ratio['median']:g} ({ratio['low']:g} to {ratio['high']:g});"
            f" {rates[name]:,.0f} / {rates['warm']:,.0f} msg/s | |"
        )
    return lines


# -- the worker process -----------------------------------------------------------------------


async def work(args: argparse.Namespace) -> None:
    from outbox.relay.runtime import Relay, tune_garbage_collector

    tune_garbage_collector()
    settings = relay_settings(args.database_url, args.url, default_concurrency())
    loop = asyncio.get_running_loop()
    async with await Relay.open(settings) as relay:
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "go":
            started = time.monotonic()
            summary = await relay.processor.execute()
            if summary.error:
                raise RuntimeError(f"cold/warm drain failed: {summary.as_dict()}")
            result = {"seconds": time.monotonic() - started, "processed": summary.processed}
            print(json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.coldwarm")
    parser.add_argument("role", choices=("worker",))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--url", required=True)
    args = parser.parse_args(argv)
    asyncio.run(work(args))


if __name__ == "__main__":
    main()
