"""A producer at a fixed offered rate, one event per transaction: ``python -m bench.offered``.

    python -m bench.offered {outbox,pgqueuer} --database-url … --rate 1000 --seconds 70 \\
        --connections 8 --commits FILE

Message ``i`` is due ``i / rate`` seconds after the start (an open loop: a slow commit does not
slow the schedule, it makes the next messages wait for a free connection); at ``seconds`` the
producer stops, whatever is still waiting is not sent (with ``--messages`` it sends that many,
however long it takes). ``connections`` asyncpg connections take
due messages in turn; each commits one event in a transaction of its own, as an application's
request handler does:

- ``outbox``: ``outbox.enqueue`` in a transaction, then, after the commit, the wake-up hint
  (``outbox.notify``, as ``outbox.transaction`` sends it): a ``NOTIFY`` in a short transaction
  with ``OUTBOX_WAKEUP=postgres``, else a message to the wake-up queue (``AzureWebJobsStorage``,
  ``OUTBOX_QUEUE_NAME``), one reused client;
- ``pgqueuer``: ``Queries.enqueue`` of the webhook body the relay would send, one statement (its
  own transaction; pgqueuer's trigger sends its ``NOTIFY`` at the commit).

Each message's id and the moment its commit returned (unix seconds) go to ``--commits`` as
``id,committed`` lines: the receiver's times are joined to them by id (the relay's
``webhook-id`` is the message id, pgqueuer's entrypoint sends the job id). Prints ``started
<unix>`` when its clock starts, then one JSON object when done: messages committed, how late
the commits ran against the schedule (p50, p99, max), and its own CPU. Runs on uvloop when it
is installed: the producer stands in for an application elsewhere, and the less of the two
cores it takes, the more is left to what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

import outbox
from bench.common import EVENT_TYPE, body, payload, percentile
from outbox.core.environment import wakes_by_postgres
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import WakeUpQueue

PGQ_ENTRYPOINT = "webhook"
# How often the schedule hands out the messages that came due (a sleep per message at 3,000/s
# would cost more than the commits).
TICK_SECONDS = 0.002
# A connection's commit of message ``i``: its ``id,committed`` line.
Commit = Callable[[int], Awaitable[str]]
Committer = Callable[[Any], Commit]


class Schedule:
    """Due messages handed to the connections in order, and how late each was taken."""

    def __init__(self, rate: float, seconds: float, messages: int = 0) -> None:
        self.rate = rate
        self.seconds = seconds if not messages else float("inf")
        self.total = messages or int(rate * seconds)
        self.due: asyncio.Queue[int | None] = asyncio.Queue()
        self.started = 0.0

    async def run(self, connections: int) -> None:
        loop = asyncio.get_running_loop()
        self.started = loop.time()
        handed = 0
        while handed < self.total and not self.over():
            now_due = min(self.total, int((loop.time() - self.started) * self.rate) + 1)
            for i in range(handed, now_due):
                self.due.put_nowait(i)
            handed = now_due
            await asyncio.sleep(TICK_SECONDS)
        for _ in range(connections):
            self.due.put_nowait(None)

    def over(self) -> bool:
        """Whether the producer's time is up (what still waits is not sent)."""
        return asyncio.get_running_loop().time() - self.started >= self.seconds

    def lateness(self, i: int) -> float:
        """Seconds since message ``i`` came due."""
        return asyncio.get_running_loop().time() - (self.started + i / self.rate)


def outbox_committer(queue: WakeUpQueue | None) -> Committer:
    def on(conn: Any) -> Commit:
        async def commit(i: int) -> str:
            async with conn.transaction():
                message_id = await outbox.enqueue(conn, EVENT_TYPE, payload(i))
            committed = time.time()
            await outbox.notify(queue, conn=conn)
            return f"{message_id},{committed:.6f}"

        return commit

    return on


def pgqueuer_committer() -> Committer:
    from pgqueuer import AsyncpgDriver, Queries

    def on(conn: Any) -> Commit:
        queries = Queries(AsyncpgDriver(conn))

        async def commit(i: int) -> str:
            [job_id] = await queries.enqueue(PGQ_ENTRYPOINT, body(i)[1], 0)
            return f"{job_id},{time.time():.6f}"

        return commit

    return on


async def connection_loop(
    commit: Commit, schedule: Schedule, lines: list[str], late: list[float]
) -> None:
    while (i := await schedule.due.get()) is not None and not schedule.over():
        late.append(schedule.lateness(i))
        lines.append(await commit(i))


async def produce(args: argparse.Namespace) -> dict[str, Any]:
    queue = None
    if args.kind == "outbox" and not wakes_by_postgres():
        queue = WakeUpQueue.from_settings(QueueSettings.load())
    committer = outbox_committer(queue) if args.kind == "outbox" else pgqueuer_committer()
    schedule = Schedule(args.rate, args.seconds, args.messages)
    lines: list[str] = []
    late: list[float] = []
    # Every connection open before the clock starts.
    conns = [await asyncpg.connect(args.database_url) for _ in range(args.connections)]
    loops = [connection_loop(committer(conn), schedule, lines, late) for conn in conns]
    print(f"started {time.time():.6f}", flush=True)
    try:
        await asyncio.gather(schedule.run(args.connections), *loops)
    finally:
        for conn in conns:
            await conn.close()
        if queue is not None:
            await queue.close()
    Path(args.commits).write_text("\n".join(lines) + "\n", encoding="ascii")
    return {
        "committed": len(lines),
        "not_sent": schedule.total - len(lines),
        "late_p50_ms": round(percentile(late, 50) * 1000, 2),
        "late_p99_ms": round(percentile(late, 99) * 1000, 2),
        "late_max_ms": round(max(late, default=0.0) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.offered")
    parser.add_argument("kind", choices=("outbox", "pgqueuer"))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--rate", type=float, required=True, help="messages per second")
    parser.add_argument("--seconds", type=float, default=0.0, help="how long to offer it")
    parser.add_argument(
        "--messages", type=int, default=0, help="offer this many instead, however long it takes"
    )
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--commits", required=True, help="where to write id,committed lines")
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(produce(args))
    else:
        result = uvloop.run(produce(args))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 2)
    json.dump(result, sys.stdout)
    print(flush=True)


if __name__ == "__main__":
    main()
