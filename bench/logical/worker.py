"""The log-tailing prototype in a process of its own, as ``bench.worker`` runs each contender.

    python -m bench.logical.worker --source {stream,sql} --record {outcomes,rows} \\
        --database-url … --url … [--messages N] [--concurrency 16]

With ``--messages N`` it stops once N messages are recorded (a drain); without, it runs until
SIGTERM, then delivers and records what it has read and confirms before it exits. It prints
``ready`` once its source is started, then one JSON object on stdout, as ``bench.worker`` does:
its own CPU, peak RSS, wall time (first message read to last outcome recorded) and counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

from bench.common import relay_settings
from bench.logical.tailer import Counters, Tailer, make_source
from bench.worker import cpu_seconds, peak_rss_mb
from outbox.relay.runtime import tune_garbage_collector


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = relay_settings(args.database_url, args.url, args.concurrency)
    tune_garbage_collector()  # as the relay's hosts do
    source = make_source(args.source, args.database_url, limit=4 * args.batch_size)
    tailer = Tailer(settings, source, args.record, batch_size=args.batch_size)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, tailer.stop)
    until = None
    if args.messages:
        messages: int = args.messages

        def until(counters: Counters) -> bool:
            return counters.recorded >= messages

    started = time.monotonic()
    running = asyncio.create_task(tailer.run(until))
    await asyncio.wait(
        [running, asyncio.ensure_future(tailer.started.wait())],
        return_when=asyncio.FIRST_COMPLETED,
    )
    print("ready", flush=True)
    counters = await running
    record = counters.record_seconds
    return {
        "source": args.source,
        "record": args.record,
        "wall_seconds": round(counters.last_recorded - counters.first_received, 4)
        if counters.recorded
        else 0.0,
        "run_seconds": round(time.monotonic() - started, 3),
        "received": counters.received,
        "delivered": counters.delivered,
        "recorded": counters.recorded,
        "transactions": counters.transactions,
        "batches": counters.batches,
        "invisible_at_first_write": counters.invisible,
        "record_median_ms": round(sorted(record)[len(record) // 2] * 1000, 2) if record else None,
        "peeks": getattr(source, "peeks", None),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.logical.worker")
    parser.add_argument("--source", choices=("stream", "sql"), default="stream")
    parser.add_argument("--record", choices=("outcomes", "rows"), default="outcomes")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--url", required=True, help="where to POST")
    parser.add_argument("--messages", type=int, default=0, help="stop once this many are done")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args(argv)
    at_start = cpu_seconds()
    result = asyncio.run(run(args))
    user, system = (end - start for end, start in zip(cpu_seconds(), at_start, strict=True))
    result["cpu_seconds"] = round(user + system, 2)
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    json.dump(result, sys.stdout)
    print(flush=True)


if __name__ == "__main__":
    main()
