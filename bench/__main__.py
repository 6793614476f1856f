"""The benchmark: ``python -m bench`` (``make bench``, every section), ``python -m bench --quick``
(``make bench-quick``: the headline in one sitting, bench/headline.py), or ``python -m bench
--smoke`` (CI).

Figures, each repeated and reported as a median:

- throughput: raw HTTP ceiling, this relay, pgqueuer and the seed's loop drain the same messages
  to the same receiver (its own process), interleaved round by round;
- latency: commit → the receiver's 2xx at fixed offered rates (100, 1,000, 3,000 msg/s), receivers
  answering in 0 and 50 ms (and one of 200 ms at 200 msg/s), for ``outbox serve`` woken over
  PostgreSQL and by the queue, the Functions app under Microsoft's worker, and pgqueuer
  (bench/latency.py);
- scale: the lease statement with 10k and with 1M finished rows, and its plan; and with 1M rows
  waiting behind 1,000 held ordering keys;
- slow: one relay process against receivers answering in 100 ms (fixed, and lognormal around
  it) against the same process and the instant receiver, per round in random order: the ratio
  of steady rates (the middle 80 % of each drain) and of whole drains' rates per round (median
  and spread), and peak RSS;
- pushback: a receiver that takes 20 requests at once and answers 429 with Retry-After to any
  more, beside one that takes all: its 429s per request taken, and the other's time beside it
  against alone;
- payloads: 1 KB, 16 KB, 64 KB and the largest payload allowed (1 MiB), each drained to the
  instant receiver: msg/s, the relay's CPU and the database's WAL per message;
- endpoints: 1,000 endpoints over 200 event types, Zipf traffic: deliveries/s, the relay's CPU
  and peak RSS, and a profile's top frames;
- exporter: the relay with the OpenTelemetry SDK and its OTLP exporter on (to a local collector),
  every delivery sampled and one in ten, against no SDK: the ratio of rates and of the relay's
  CPU per message, per round (median and spread);
- backlog: one relay process draining a million due rows: its time, and the lease's p50 / p99
  at the drain's start, middle and end;
- sustained: ten minutes at a steady offered load with autovacuum on and the retention purge
  running: lease and commit → webhook p50 / p99 and the table's size per minute, and how flat
  they stay;
- memory: the relay's peak RSS draining a 100k backlog;
- isolation: 200 messages for a healthy endpoint behind 1,000 for one that never answers;
- beside: 500 for a healthy endpoint beside 5,000 for a blackholed one (timeout 10 s): the healthy
  endpoint's time against its time alone, per round (its fair share of the slots; target <= 3x);
- scaleout: a 100k backlog drained by one relay, then by 8 racing: the database's WAL and CPU per
  message, and the slowest lease;
- fanout: the database's cost per delivery with two endpoints per event type against one;
- instructions: instructions per message of the raw client, the floor and the relay (valgrind),
  which do not move with the machine's load as CPU seconds do;
- partitions: the partitioned layout against the plain table (bench/partitions.py): retention
  by DROP against DELETE over three simulated days, the hot path's cost, and the lease with a
  transaction held open during a steady stream;
- console: the first page of each of the console's filters and its overview over 10M messages,
  and the WAL per message with and without the index its unfiltered list reads;
- console_calls: every API call the console's page makes (overview, each list, the next page,
  a detail, actions, endpoints), through the HTTP API, over an incident's 500,000 Pending rows:
  median and p95 of each, and the plans (what each list sorts).

- coldwarm: a new process's drain of a backlog to a lognormal ~100 ms receiver against the same
  drain by a process that has delivered to it already (bench/coldwarm.py);
- walcost: WAL per delivered message, relay ÷ pgqueuer, by the method the targets use (a steady
  flow of one-event transactions, split by writer with pg_walinspect; bench/walcost.py).

Throughput, scale-out and fan-out read WAL and PostgreSQL CPU on a private embedded server.

The smoke run uses tiny sizes and checks only that every message of every contender arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from bench import (
    backlog,
    console,
    dbcost,
    endpoints,
    exporter,
    headline,
    instructions,
    isolation,
    latency,
    memory,
    partitions,
    payloads,
    report,
    scale,
    slow,
    sustained,
    throughput,
)
from bench.common import ReceiverProcess, admin_dsn, log

PHASES = (
    "throughput",
    "latency",
    "slow",
    "pushback",
    "payloads",
    "endpoints",
    "exporter",
    "backlog",
    "sustained",
    "scale",
    "memory",
    "isolation",
    "beside",
    "scaleout",
    "fanout",
    "instructions",
    "console",
    "console_calls",
    "partitions",
    "coldwarm",
    "walcost",
)
# Rows per lease (the relay's default), and per pgqueuer dequeue.
BATCH_SIZE = 100
SMOKE = {
    "messages": 500,
    "rounds": 1,
    **latency.SMOKE,
    "slow_messages": 300,
    "slow_runs": 1,
    "pushback_messages": 100,
    "payload_messages": 50,
    "payload_max_messages": 5,
    "payload_runs": 1,
    "endpoints_messages": 200,
    "endpoints_types": 20,
    "endpoints_runs": 1,
    "exporter_messages": 200,
    "exporter_runs": 1,
    "backlog_messages": 2_000,
    "backlog_runs": 1,
    "sustained_seconds": 6.0,
    "sustained_rate": 50.0,
    "sustained_window": 2.0,
    "sustained_purge_every": 1.0,
    "scale_small": 2_000,
    "scale_large": 20_000,
    "scale_failed": 2_000,
    "scale_repeats": 3,
    "held_keys": 20,
    "held_behind": 50,
    "held_fresh_keys": 5,
    "held_backlog": 2_000,
    "held_backlog_keys": 2,
    "memory_messages": 1_000,
    "memory_runs": 1,
    "isolation_dead": 50,
    "isolation_healthy": 20,
    "isolation_timeout": 1.0,
    "isolation_runs": 1,
    "beside_dead": 50,
    "beside_healthy": 20,
    "beside_timeout": 1.0,
    "beside_runs": 1,
    "scaleout_messages": 2_000,
    "scaleout_relays": 3,
    "scaleout_runs": 1,
    "fanout_messages": 500,
    "fanout_runs": 1,
    "instructions_small": 50,
    "instructions_large": 150,
    # Each contender under valgrind takes 10-30 s on 2 cores: the smoke run leaves out the
    # floor and the untraced relay, whose delivery the throughput section checks.
    "instructions_contenders": "raw,relay,relay-uvloop",
    "console_rows": 20_000,
    "console_repeats": 3,
    "console_wal_messages": 500,
    "console_wal_runs": 1,
    "console_pending": 3_000,
    "console_processing": 20,
    "console_history": 2_000,
    "console_call_rounds": 2,
    **partitions.SMOKE,
    **headline.SMOKE,
}


def add_section_options(parser: argparse.ArgumentParser) -> None:
    """The options of the slow, push-back, payload-size, endpoints and exporter sections."""
    add = parser.add_argument
    # 40,000, not 10,000: at 1,024 slots a drain of 10,000 to the 100 ms receiver lasts two
    # seconds, a quarter of them the endpoint's limit growing from 16 and the last batches' tail
    # (docs/performance.md).
    add("--slow-messages", type=int, default=40_000, help="messages per slow-receiver run")
    add(
        "--slow-concurrency",
        type=int,
        default=0,
        help="the slow section's OUTBOX_CONCURRENCY (default: the relay's default)",
    )
    add("--slow-runs", type=int, default=3, help="rounds of the slow and push-back sections")
    add("--pushback-messages", type=int, default=2_000, help="per endpoint, push-back figure")
    add("--payload-messages", type=int, default=2_000, help="per payload size below the largest")
    add("--payload-max-messages", type=int, default=200, help="of the largest payload allowed")
    add("--payload-runs", type=int, default=3, help="rounds of the payload-size section")
    add("--endpoints-messages", type=int, default=10_000, help="many-endpoints backlog")
    add("--endpoints-types", type=int, default=200, help="event types, five endpoints each")
    add("--endpoints-runs", type=int, default=3, help="rounds of the many-endpoints section")
    add("--exporter-messages", type=int, default=20_000, help="per drain, exporter section")
    add("--exporter-runs", type=int, default=3, help="rounds of the exporter section")
    add("--backlog-messages", type=int, default=1_000_000, help="the backlog drained at once")
    add("--backlog-runs", type=int, default=1, help="rounds of the backlog section")
    add("--sustained-seconds", type=float, default=600.0, help="the sustained run's length")
    add("--sustained-rate", type=float, default=200.0, help="its offered load, msg/s")
    add("--sustained-window", type=float, default=60.0, help="seconds per reported window")
    add("--sustained-purge-every", type=float, default=10.0, help="seconds between purges")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--messages", type=int, default=20_000, help="messages per throughput run")
    add("--rounds", type=int, default=5, help="throughput runs per contender")
    add("--concurrency", type=int, default=16, help="HTTP requests in flight, every contender")
    add("--contenders", default=",".join(throughput.CONTENDERS))
    add(
        "--pgq-max-tasks",
        type=int,
        default=2 * BATCH_SIZE,
        help="pgqueuer max_concurrent_tasks (0: unset); by default twice the batch size, the "
        "least pgqueuer accepts and what its performance-tuning guide sets for a batch",
    )
    latency.add_arguments(parser)
    add_section_options(parser)
    add("--scale-small", type=int, default=10_000)
    add("--scale-large", type=int, default=1_000_000)
    add("--scale-failed", type=int, default=100_000)
    add("--scale-pending", type=int, default=1_000)
    add("--scale-repeats", type=int, default=25)
    add("--held-keys", type=int, default=1_000, help="held ordering keys in the held-keys figure")
    add("--held-behind", type=int, default=1_000, help="rows waiting behind each held key")
    add("--held-fresh-keys", type=int, default=50, help="held keys whose rows are parked afresh")
    add("--held-backlog", type=int, default=1_000_000, help="never-seen rows behind held keys")
    add("--held-backlog-keys", type=int, default=1, help="held keys those rows wait behind")
    add("--memory-messages", type=int, default=100_000)
    add("--memory-runs", type=int, default=3)
    add("--isolation-dead", type=int, default=1_000, help="messages for the dead endpoint")
    add("--isolation-healthy", type=int, default=200, help="messages for the healthy one")
    add("--isolation-timeout", type=float, default=3.0, help="HTTP timeout, seconds")
    add("--isolation-runs", type=int, default=3)
    add("--beside-dead", type=int, default=5_000, help="messages for the blackholed endpoint")
    add("--beside-healthy", type=int, default=500, help="messages for the healthy one beside it")
    add("--beside-timeout", type=float, default=10.0, help="HTTP timeout, seconds")
    add("--beside-runs", type=int, default=3, help="rounds (alone, then beside)")
    add("--scaleout-messages", type=int, default=100_000, help="the scale-out backlog")
    add("--scaleout-relays", type=int, default=8, help="relay processes racing over it")
    add("--scaleout-runs", type=int, default=3)
    add("--fanout-messages", type=int, default=20_000)
    add("--fanout-runs", type=int, default=3)
    add("--instructions-small", type=int, default=1_000, help="the smaller drain under valgrind")
    add("--instructions-large", type=int, default=5_000, help="the larger drain under valgrind")
    add(
        "--instructions-contenders",
        default=",".join(instructions.CONTENDERS),
        help="counted under valgrind (the raw client always)",
    )
    console.add_arguments(parser)
    console.add_incident_arguments(parser)
    partitions.add_arguments(parser)
    headline.add_arguments(parser)
    add("--skip", default="", help=f"comma-separated phases to skip: {', '.join(PHASES)}")
    add("--output-json", type=Path, help="write the results here")
    add("--plot", type=Path, help="write the PNG plot here")
    add("--smoke", action="store_true", help="tiny sizes, correctness only (for CI)")
    add(
        "--quick",
        action="store_true",
        help="the headline sections only, shortened (under 30 min; options given still apply)",
    )
    return with_profile(parser, argv)


def with_profile(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments, with the quick profile's sizes (as defaults: an option given on the
    command line still wins) or the smoke run's (overriding)."""
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**headline.QUICK)
        args = parser.parse_args(argv)
        skipped = {*headline.quick_skip(PHASES).split(","), *args.skip.split(",")}
        args.skip = ",".join(sorted(filter(None, skipped)))
    if args.smoke:
        vars(args).update(SMOKE)
        scratch = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
        vars(args).update(
            output_json=args.output_json or scratch / "results.json",
            plot=args.plot or scratch / "results.png",
        )
    return args


async def delivery_phases(
    args: argparse.Namespace, skip: set[str], receiver: ReceiverProcess
) -> dict[str, Any]:
    """Throughput, latency, slow receivers, payload sizes, endpoints, memory."""
    results: dict[str, Any] = {}
    if "throughput" not in skip:
        options = throughput.Options(
            messages=args.messages,
            concurrency=args.concurrency,
            pgq_max_tasks=args.pgq_max_tasks,
        )
        contenders = tuple(args.contenders.split(","))
        runs = await throughput.measure(receiver, options, args.rounds, contenders)
        results["throughput"] = report.summarise_throughput(runs)
    if "latency" not in skip:
        results["latency"] = await latency.measure(receiver, latency.plan_from(args))
    if "slow" not in skip:
        results["slow"] = await slow.measure(
            receiver,
            messages=args.slow_messages,
            runs=args.slow_runs,
            concurrency=args.slow_concurrency or None,
        )
    if "pushback" not in skip:
        results["pushback"] = await slow.measure_pushback(
            receiver, messages=args.pushback_messages, runs=args.slow_runs
        )
    if "payloads" not in skip:
        results["payloads"] = await payloads.measure(
            receiver,
            messages=args.payload_messages,
            max_messages=args.payload_max_messages,
            runs=args.payload_runs,
            concurrency=args.concurrency,
        )
    if "endpoints" not in skip:
        results["endpoints"] = await endpoints.measure(
            receiver,
            messages=args.endpoints_messages,
            types=args.endpoints_types,
            per_type=5,
            runs=args.endpoints_runs,
            concurrency=args.concurrency,
        )
    if "memory" not in skip:
        results["memory"] = await memory.measure(
            receiver,
            messages=args.memory_messages,
            runs=args.memory_runs,
            concurrency=args.concurrency,
        )
    return results


async def real_world_phases(
    args: argparse.Namespace, skip: set[str], receiver: ReceiverProcess
) -> dict[str, Any]:
    """An exporter on, a million-row backlog, minutes of steady load."""
    results: dict[str, Any] = {}
    if "exporter" not in skip:
        results["exporter"] = await exporter.measure(
            receiver,
            messages=args.exporter_messages,
            runs=args.exporter_runs,
            concurrency=args.concurrency,
        )
    if "backlog" not in skip:
        results["backlog"] = await backlog.measure(
            receiver,
            messages=args.backlog_messages,
            runs=args.backlog_runs,
            concurrency=args.concurrency,
        )
    if "sustained" not in skip:
        results["sustained"] = await sustained.measure(
            receiver,
            seconds=args.sustained_seconds,
            rate=args.sustained_rate,
            window=args.sustained_window,
            purge_every=args.sustained_purge_every,
            concurrency=args.concurrency,
        )
    return results


async def cost_phases(
    args: argparse.Namespace, skip: set[str], receiver: ReceiverProcess
) -> dict[str, Any]:
    """Isolation, beside, scale-out, fan-out, instructions."""
    results: dict[str, Any] = {}
    if "isolation" not in skip:
        results["isolation"] = await isolation.measure(
            receiver,
            dead=args.isolation_dead,
            healthy=args.isolation_healthy,
            http_timeout=args.isolation_timeout,
            runs=args.isolation_runs,
            concurrency=args.concurrency,
        )
    if "beside" not in skip:
        results["beside"] = await isolation.measure_beside(
            receiver,
            dead=args.beside_dead,
            healthy=args.beside_healthy,
            http_timeout=args.beside_timeout,
            runs=args.beside_runs,
            concurrency=args.concurrency,
        )
    if "scaleout" not in skip:
        results["scaleout"] = await dbcost.measure_scaleout(
            receiver,
            messages=args.scaleout_messages,
            relays=args.scaleout_relays,
            runs=args.scaleout_runs,
            concurrency=args.concurrency,
        )
    if "fanout" not in skip:
        results["fanout"] = await dbcost.measure_fanout(
            receiver,
            messages=args.fanout_messages,
            runs=args.fanout_runs,
            concurrency=args.concurrency,
        )
    if "instructions" not in skip:
        results["instructions"] = await instructions.measure(
            receiver,
            small=args.instructions_small,
            large=args.instructions_large,
            contenders=tuple(args.instructions_contenders.split(",")),
            concurrency=args.concurrency,
        )
    return results


async def run(args: argparse.Namespace) -> dict[str, Any]:
    skip = {phase for phase in args.skip.split(",") if phase}
    results: dict[str, Any] = {}
    with ReceiverProcess() as receiver:
        results.update(await delivery_phases(args, skip, receiver))
        results.update(await real_world_phases(args, skip, receiver))
        results.update(await cost_phases(args, skip, receiver))
        results.update(await headline.phases(args, skip, receiver))
        if "console" not in skip:
            results["console"] = await console.measure(
                receiver,
                rows=args.console_rows,
                repeats=args.console_repeats,
                wal_messages=args.console_wal_messages,
                wal_runs=args.console_wal_runs,
                concurrency=args.concurrency,
            )
        if "console_calls" not in skip:
            results["console_calls"] = await console.measure_incident(
                receiver,
                pending=args.console_pending,
                processing=args.console_processing,
                history=args.console_history,
                failed_every=args.console_failed_every,
                rounds=args.console_call_rounds,
            )
        if "partitions" not in skip:
            results["partitions"] = await partitions.measure(receiver, args)
    if "scale" not in skip:
        results["scale"] = await scale.measure(
            small=args.scale_small,
            large=args.scale_large,
            failed=args.scale_failed,
            pending=args.scale_pending,
            repeats=args.scale_repeats,
        )
        results["held_keys"] = await scale.measure_held(
            keys=args.held_keys,
            behind=args.held_behind,
            pending=args.scale_pending,
            repeats=args.scale_repeats,
            fresh_keys=args.held_fresh_keys,
            backlog_keys=args.held_backlog_keys,
            backlog=args.held_backlog,
        )
    return results


def config(args: argparse.Namespace) -> dict[str, Any]:
    values = {k: v for k, v in vars(args).items() if k not in ("output_json", "plot")}
    values["batch_size"] = BATCH_SIZE
    max_tasks = args.pgq_max_tasks or "unset (its default)"
    values["pgqueuer"] = (
        f"QueueManager(Queries(AsyncpgDriver(one asyncpg connection))), run(mode=drain, "
        f"batch_size={BATCH_SIZE}, max_concurrent_tasks={max_tasks}), its default dequeue and "
        f"heartbeat timeouts; entrypoint without concurrency_limit; schema from "
        f"Queries.install(); entrypoint POSTs job.payload, signed (Standard Webhooks headers, "
        f"as the relay's), over a shared aiohttp session with {args.concurrency} connections"
    )
    return values


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    admin_dsn()  # find (or start) the PostgreSQL server before the event loop runs
    load = os.getloadavg()  # what else the machine ran: a figure's context
    results = asyncio.run(run(args))
    results["load_average"] = {"start": load, "end": os.getloadavg()}
    doc = report.document(config(args), results)
    if args.output_json:
        report.write_json(args.output_json, doc)
        log(f"results: {args.output_json}")
    if args.plot:
        report.plot(args.plot, doc)
        log(f"plot: {args.plot}")
    if args.smoke:
        # Tiny sizes on a shared machine: the figures mean nothing, so no target is judged.
        log("smoke run passed: every contender delivered every message")
    elif args.quick:
        print(headline.table(doc))
    else:
        tables = [report.table(doc), *partitions.table_lines(doc), *headline.table_lines(doc)]
        print("\n".join(tables))


if __name__ == "__main__":
    main()
