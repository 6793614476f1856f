"""Latency under steady load: from a producer's commit to the receiver's 2xx, at fixed offered
rates, for each way the relay runs, beside pgqueuer in the same run.

Contenders (``bench.hosts``): ``outbox serve`` woken over PostgreSQL (``serve_postgres``) and by
the wake-up queue on Azurite (``serve_queue``), the Functions app under Microsoft's Python
worker with its queue trigger driven as the host drives it (``functions``), and pgqueuer's
worker woken by its LISTEN/NOTIFY (``pgqueuer``). Per round, in an order drawn per round, each
contender gets a fresh database (and a fresh Azurite) per receiver, is started and warmed, and
is offered each rate in turn, lowest first:

- producers (``bench.offered``, a process of its own, ``connections`` connections;
  ``queue_connections`` where each commit's hint goes to the queue and waits for its answer, as
  an application's request would, so that more requests are open at once) commit one
  event per transaction on an open-loop schedule for ``warmup + seconds``; only messages
  committed in the last ``seconds`` count;
- the receiver answers ``/timed/<ms>`` after 0 ms and after 50 ms (``delays``), and keeps each
  request's arrival and answer; each message's latency is its answer (and its arrival) minus
  the moment the producer's commit returned, joined by webhook id (one machine, one clock);
- ``slow``: a receiver answering in 200 ms at 200 msg/s, judged on commit → request (the
  arrival): whether the receiver's latency holds back what is sent next.

Per rate: commit → 2xx p50 / p95 / p99 / max, commit → request p99, the rate achieved (commits
in the window ÷ its length), the contender's process CPU and PostgreSQL's per message, WAL per
message, duplicates and messages not delivered, the hints left in the wake-up queue, and
growth: the last quarter's p50 ÷ the first's, and the slope of each second's p50 (ms per s).
A rate is sustained when the producers kept to it (95 %), every message arrived and the last
quarter's p50 stayed within twice the first's plus 20 ms. Autovacuum is on for the section (as
in ``sustained``): minutes at thousands a second are not a backlog drained once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import hosts, walcost
from bench.common import ROOT, CpuMeter, Database, ReceiverProcess, log, median, percentile
from bench.server import wal_bytes, wal_lsn
from bench.sustained import autovacuum_on
from bench.throughput import install_pgqueuer

# Nothing new at the receiver for this long after the producers stopped: the rest is lost.
QUIET_SECONDS = 15.0
# The goals (docs/performance.md): p99 in ms at the instant receiver, and the slow
# receiver's commit → request p99.
GOALS = {
    "latency_serve_postgres_p99_ms": (1000.0, 50.0),
    "latency_serve_queue_p99_ms": (1000.0, 1500.0),
    "latency_functions_p99_ms": (1000.0, 1500.0),
}
SLOW_GOAL_MS = 50.0


@dataclass(frozen=True)
class Plan:
    """What the section runs: rates (msg/s), receiver delays (ms), the slow scenario (receiver
    ms, rate), seconds per rate after ``warmup``, rounds, producer connections, contenders."""

    rates: tuple[float, ...] = (100.0, 1000.0, 3000.0)
    delays: tuple[int, ...] = (0, 50)
    slow: tuple[int, float] | None = (200, 200.0)
    seconds: float = 60.0
    warmup: float = 10.0
    rounds: int = 1
    connections: int = 8
    queue_connections: int = 48
    contenders: tuple[str, ...] = hosts.CONTENDERS
    pgq_max_tasks: int = 200


@dataclass
class Window:
    """The measured part of one rate: its start and end (unix seconds), and the CPU seconds
    of the contender, the receiver and PostgreSQL within it."""

    start: float
    end: float
    cpu: dict[str, float] = field(default_factory=dict)
    lsn: tuple[str, str] = ("", "")


# The smoke run's sizes: every contender, the instant receiver and the slow one, for seconds
# (a 50 ms receiver is the same path with another delay).
SMOKE = {
    "latency_rates": "50",
    "latency_delays": "0",
    "latency_slow": "200@20",
    "latency_seconds": 2.0,
    "latency_warmup": 0.5,
    "latency_rounds": 1,
    "latency_connections": 2,
    "latency_queue_connections": 2,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--latency-rates", default="100,1000,3000", help="offered rates, msg/s, comma-separated")
    add("--latency-delays", default="0,50", help="the receiver's answer times, ms")
    add(
        "--latency-slow",
        default="200@200",
        help="a slow receiver's ms @ its rate, judged on commit → request ('' for none)",
    )
    add("--latency-seconds", type=float, default=60.0, help="measured seconds per rate")
    add("--latency-warmup", type=float, default=10.0, help="seconds offered before each")
    add("--latency-rounds", type=int, default=1)
    add("--latency-connections", type=int, default=16, help="the producers' connections")
    add(
        "--latency-queue-connections",
        type=int,
        default=48,
        help="the producers' connections where each commit's hint goes to the wake-up queue",
    )
    add("--latency-contenders", default=",".join(hosts.CONTENDERS))


def plan_from(args: argparse.Namespace) -> Plan:
    slow = None
    if args.latency_slow:
        ms, _, rate = args.latency_slow.partition("@")
        slow = (int(ms), float(rate))
    return Plan(
        rates=tuple(float(r) for r in args.latency_rates.split(",")),
        delays=tuple(int(d) for d in args.latency_delays.split(",")),
        slow=slow,
        seconds=args.latency_seconds,
        warmup=args.latency_warmup,
        rounds=args.latency_rounds,
        connections=args.latency_connections,
        queue_connections=args.latency_queue_connections,
        contenders=tuple(args.latency_contenders.split(",")),
        pgq_max_tasks=max(args.pgq_max_tasks, 200),
    )


async def measure(receiver: ReceiverProcess, plan: Plan) -> dict[str, Any]:
    skipped: dict[str, str] = {}
    deployed, scratch = None, None
    contenders = list(plan.contenders)
    if "functions" in contenders:
        deployed, scratch, reason = build_functions_app()
        if deployed is None:
            contenders.remove("functions")
            skipped["functions"] = reason
            log(f"latency: functions skipped: {reason}")
    runs: list[dict[str, Any]] = []
    order = random.Random()
    try:
        async with autovacuum_on():
            for round_ in range(1, plan.rounds + 1):
                order.shuffle(contenders)
                log(f"latency round {round_}: {', '.join(contenders)}")
                for name in contenders:
                    for delay in plan.delays:
                        found = await run_contender(
                            receiver, plan, name, delay, plan.rates, deployed
                        )
                        runs += [{**run, "scenario": "steady", "round": round_} for run in found]
                    if plan.slow:
                        slow_ms, slow_rate = plan.slow
                        found = await run_contender(
                            receiver, plan, name, slow_ms, (slow_rate,), deployed
                        )
                        runs += [{**run, "scenario": "slow", "round": round_} for run in found]
    finally:
        if scratch is not None:
            scratch.cleanup()
    return summarise(runs, plan, skipped)


def build_functions_app() -> tuple[Any, Any, str]:
    """The app as Flex builds it (cached under .venv/deployment-cache), or why it cannot be."""
    from tests.support.deployment import build_app, deployed_python

    try:
        python = deployed_python()
    except RuntimeError as exc:
        return None, None, str(exc)
    scratch = tempfile.TemporaryDirectory(prefix="bench-flex-")
    log("latency: building the Functions app as Flex does (cached after the first time)")
    return build_app(Path(scratch.name), python), scratch, ""


def make_contender(name: str, db: Database, hook: str, plan: Plan, deployed: Any) -> Any:
    if name == "serve_postgres":
        return hosts.ServeProcess(db.url, hook, "postgres")
    if name == "serve_queue":
        return hosts.ServeProcess(db.url, hook, "queue")
    if name == "functions":
        return hosts.FunctionsApp(deployed, db.url, hook)
    return hosts.PgqueuerService(db.url, hook, plan.pgq_max_tasks)


async def run_contender(
    receiver: ReceiverProcess,
    plan: Plan,
    name: str,
    delay: int,
    rates: tuple[float, ...],
    deployed: Any = None,
) -> list[dict[str, Any]]:
    """One contender, started once against a receiver of ``delay`` ms, offered each rate."""
    results = []
    async with Database("latency") as db:
        conn = await db.connect()
        try:
            if name == "pgqueuer":
                await install_pgqueuer(conn)
            else:
                await db.migrate()
        finally:
            await conn.close()
        contender = make_contender(name, db, receiver.url(f"/timed/{delay}"), plan, deployed)
        async with contender:
            for rate in rates:
                found = await run_rate(receiver, contender, db, rate, plan, delay)
                found.update(await contender.after_rate())
                result = {"contender": name, "delay_ms": delay, "rate": rate, **found}
                log(f"latency {name}, receiver {delay} ms, {rate:g} msg/s: {brief(result)}")
                results.append(result)
    return results


def brief(result: dict[str, Any]) -> str:
    keys = ("achieved", "p50_ms", "p99_ms", "max_ms", "request_p99_ms", "relay_cpu_us_per_msg")
    parts = [f"{k} {result[k]:g}" for k in keys if result.get(k) is not None]
    flags = [
        f"{k} {result[k]}"
        for k in ("undelivered", "swept", "duplicates", "hints_left")
        if result.get(k)
    ]
    return ", ".join(parts + flags + [f"sustained {result['sustained']}"])


async def run_rate(
    receiver: ReceiverProcess,
    contender: Any,
    db: Database,
    rate: float,
    plan: Plan,
    delay: int,
) -> dict[str, Any]:
    await receiver.reset()
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as folder:
        commits_file = Path(folder) / "commits.csv"
        producer = await start_producer(contender, db, rate, plan, commits_file)
        window = await measure_window(producer, contender, receiver, db, plan)
        summary = await finish_producer(producer)
        commits = read_commits(commits_file)
    swept = await wait_for_every_message(receiver, contender, commits, delay)
    timed = await receiver.timed()
    figures = latency_figures(commits, timed, window, rate, plan.seconds, swept)
    counted = figures["messages"] or 1
    figures["relay_cpu_us_per_msg"] = round(window.cpu["contender"] / counted * 1e6, 1)
    figures["postgres_cpu_us_per_msg"] = round(window.cpu["postgres"] / counted * 1e6, 1)
    figures.update(await wal_figures(db, window, contender.name, counted))
    if "queue_service" in window.cpu:
        figures["azurite_cpu_us_per_msg"] = round(window.cpu["queue_service"] / counted * 1e6, 1)
    figures["producer"] = summary
    return figures


async def wal_figures(db: Database, window: Window, name: str, messages: int) -> dict[str, Any]:
    """WAL per message in the window, and by whose transaction wrote it (``bench.walcost``):
    the producers' (their inserts and commits), the relay's wake-ups (a NOTIFY's own commit),
    the consumer's, and records of no transaction (images for hint bits, snapshots)."""
    queue_table = "pgqueuer" if name == "pgqueuer" else "outbox_messages"
    conn = await db.connect()
    try:
        total = await wal_bytes(conn, *window.lsn)
        writers = await walcost.bytes_by_writer(conn, *window.lsn, queue_table)
    finally:
        await conn.close()
    return {
        "wal_bytes_per_msg": round(total / messages, 1),
        "wal_by_writer_per_msg": {k: round(v / messages, 1) for k, v in writers.items()},
    }


async def start_producer(
    contender: Any, db: Database, rate: float, plan: Plan, commits_file: Path
) -> asyncio.subprocess.Process:
    kind = hosts.PRODUCER[contender.name]
    connections = (
        plan.queue_connections if contender.name in hosts.QUEUE_HINTED else plan.connections
    )
    command = [
        *(sys.executable, "-m", "bench.offered", kind, "--database-url", db.url),
        *("--rate", str(rate), "--seconds", str(plan.warmup + plan.seconds)),
        *("--connections", str(connections), "--commits", str(commits_file)),
    ]
    env = {**hosts.clean_environment(), **contender.producer_env}
    return await asyncio.create_subprocess_exec(
        *command, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
    )


async def measure_window(
    producer: asyncio.subprocess.Process,
    contender: Any,
    receiver: ReceiverProcess,
    db: Database,
    plan: Plan,
) -> Window:
    """Wait for the producer's clock, then sample CPU and WAL at the window's ends."""
    assert producer.stdout is not None
    line = (await asyncio.wait_for(producer.stdout.readline(), 60)).decode()
    if not line.startswith("started "):
        raise RuntimeError(f"the producer did not start: {line!r}")
    started = float(line.split()[1])
    window = Window(start=started + plan.warmup, end=started + plan.warmup + plan.seconds)
    conn = await db.connect()
    try:
        await asyncio.sleep(max(0.0, window.start - time.time()))
        lsn = await wal_lsn(conn)
        cpu_at_start, meter = contender.cpu_seconds(), CpuMeter(receiver.pid)
        queue_at_start = contender.queue_service_cpu()
        await asyncio.sleep(max(0.0, window.end - time.time()))
        window.cpu = {"contender": contender.cpu_seconds() - cpu_at_start, **meter.stop()}
        if queue_at_start is not None:
            window.cpu["queue_service"] = contender.queue_service_cpu() - queue_at_start
        window.lsn = (lsn, await wal_lsn(conn))
    finally:
        await conn.close()
    return window


async def finish_producer(producer: asyncio.subprocess.Process) -> dict[str, Any]:
    assert producer.stdout is not None
    out = await producer.stdout.read()
    if await producer.wait() != 0 or not out.strip():
        raise RuntimeError("the producer failed (its error is above)")
    summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return summary


def read_commits(path: Path) -> dict[str, float]:
    commits = {}
    for line in path.read_text(encoding="ascii").splitlines():
        if line:
            message_id, committed = line.split(",")
            commits[message_id] = float(committed)
    return commits


async def wait_for_every_message(
    receiver: ReceiverProcess, contender: Any, commits: dict[str, float], delay: int
) -> set[str]:
    """Until every committed message arrived; the ids a sweep had to deliver.

    A hint the producer could not send (the queue did not answer in time: the producer logs
    each) leaves its message to the five-minute timer's sweep, unless a later hint's drain takes
    it. Where messages are still missing once nothing arrives for ``QUIET_SECONDS``, the sweep
    runs now (``contender.sweep()``); those are reported apart, not in the percentiles. A
    contender that cannot lose a wake-up (NOTIFY) fails the run instead.
    """
    await wait_for_arrivals(receiver, len(commits))
    await asyncio.sleep(delay / 1000 + 0.2)  # the last answers
    lost = set(commits) - set((await receiver.timed())["ids"])
    if lost and contender.azurite is not None:
        await contender.sweep()
        await wait_for_arrivals(receiver, len(commits))
        await asyncio.sleep(delay / 1000 + 0.2)
        swept, lost = lost, set(commits) - set((await receiver.timed())["ids"])
    else:
        swept = set()
    if lost:
        raise AssertionError(
            f"latency: {contender.name} delivered {len(commits) - len(lost)} of {len(commits)} "
            f"messages (none arrived for {QUIET_SECONDS:g} s)"
        )
    return swept


async def wait_for_arrivals(receiver: ReceiverProcess, messages: int) -> None:
    """Until the receiver counted ``messages`` requests, or none came for ``QUIET_SECONDS``."""
    seen, changed = -1, time.monotonic()
    while (count := await receiver.requests()) < messages:
        if count != seen:
            seen, changed = count, time.monotonic()
        elif time.monotonic() - changed > QUIET_SECONDS:
            return
        await asyncio.sleep(0.2)


def latency_figures(
    commits: dict[str, float],
    timed: dict[str, list[Any]],
    window: Window,
    rate: float,
    seconds: float,
    swept: set[str] | None = None,
) -> dict[str, Any]:
    """Latencies of the messages committed within the window (ms), and how they moved; those
    ``swept`` (their hint was lost) are counted apart."""
    swept = swept or set()
    first: dict[str, tuple[float, float]] = {}
    for message_id, arrived, answered in zip(
        timed["ids"], timed["arrived"], timed["answered"], strict=True
    ):
        if answered and message_id not in first:
            first[message_id] = (arrived, answered)
    counted = [(c, i) for i, c in commits.items() if window.start <= c < window.end]
    counted.sort()
    delivered = [(c, first[i]) for c, i in counted if i in first and i not in swept]
    in_window_swept = sum(1 for _, i in counted if i in swept)
    answers = [(answered - c) * 1000 for c, (_, answered) in delivered]
    requests = [(arrived - c) * 1000 for c, (arrived, _) in delivered]
    growth = how_it_moved([c for c, _ in delivered], answers, window)
    achieved = len(counted) / seconds
    undelivered = len(counted) - len(delivered) - in_window_swept
    held = growth["last_p50_ms"] <= 2 * growth["first_p50_ms"] + 20
    sustained = achieved >= 0.95 * rate and not undelivered and held
    return {
        "messages": len(counted),
        "achieved": round(achieved, 1),
        **percentiles(answers, ""),
        **percentiles(requests, "request_"),
        "undelivered": undelivered,
        "swept": in_window_swept,
        "duplicates": len(timed["ids"]) - len(set(timed["ids"])),
        "growth": growth,
        "sustained": sustained,
    }


def percentiles(values: list[float], prefix: str) -> dict[str, float | None]:
    if not values:
        return {f"{prefix}{k}_ms": None for k in ("p50", "p95", "p99", "max")}
    return {
        f"{prefix}p50_ms": round(percentile(values, 50), 1),
        f"{prefix}p95_ms": round(percentile(values, 95), 1),
        f"{prefix}p99_ms": round(percentile(values, 99), 1),
        f"{prefix}max_ms": round(max(values), 1),
    }


def how_it_moved(commits: list[float], latencies: list[float], window: Window) -> dict[str, float]:
    """The first and last quarters' p50 and p99 (by commit time), and the least-squares slope of
    each second's p50 over the window (ms per second): near 0 where latency holds, about
    ``1000 * (1 - capacity / rate)`` where a backlog grows."""
    quarter = (window.end - window.start) / 4
    first = [v for c, v in zip(commits, latencies, strict=True) if c < window.start + quarter]
    last = [v for c, v in zip(commits, latencies, strict=True) if c >= window.end - quarter]
    seconds: dict[int, list[float]] = {}
    for c, v in zip(commits, latencies, strict=True):
        seconds.setdefault(int(c - window.start), []).append(v)
    xs = sorted(seconds)
    ys = [statistics.median(seconds[x]) for x in xs]
    slope = statistics.linear_regression(xs, ys).slope if len(xs) > 2 else 0.0
    first_p50, last_p50 = percentile(first, 50), percentile(last, 50)
    return {
        "first_p50_ms": round(first_p50, 1),
        "last_p50_ms": round(last_p50, 1),
        "first_p99_ms": round(percentile(first, 99), 1),
        "last_p99_ms": round(percentile(last, 99), 1),
        "last_vs_first_p50": round(last_p50 / first_p50, 3) if first_p50 else float("nan"),
        "p50_slope_ms_per_s": round(slope, 2),
    }


# -- the summary: medians over rounds, per-round ratios against pgqueuer, goals ---------------


def key(run: dict[str, Any]) -> tuple[str, str, int, float]:
    return run["scenario"], run["contender"], run["delay_ms"], run["rate"]


def summarise(runs: list[dict[str, Any]], plan: Plan, skipped: dict[str, str]) -> dict[str, Any]:
    cells: dict[tuple[str, str, int, float], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault(key(run), []).append(run)
    table = [
        {
            "scenario": scenario,
            "contender": name,
            "delay_ms": delay,
            "rate": rate,
            **{
                figure: median([r[figure] for r in found if r[figure] is not None])
                for figure in (
                    "achieved",
                    "p50_ms",
                    "p95_ms",
                    "p99_ms",
                    "max_ms",
                    "request_p99_ms",
                    "relay_cpu_us_per_msg",
                    "postgres_cpu_us_per_msg",
                    "wal_bytes_per_msg",
                )
            },
            "sustained": all(r["sustained"] for r in found),
            "swept": sum(r.get("swept", 0) for r in found),
            "hints_left": median([r.get("hints_left", 0) for r in found]),
            "last_vs_first_p50": median([r["growth"]["last_vs_first_p50"] for r in found]),
            "rounds": len(found),
        }
        for (scenario, name, delay, rate), found in sorted(cells.items())
    ]
    return {
        "plan": asdict(plan),
        "skipped": skipped,
        "runs": runs,
        "table": table,
        "vs_pgqueuer": ratios_to_pgqueuer(runs),
        "highest_sustained": highest_sustained(table),
        "goals": goals(table),
        "goals_not_offered": goals_not_offered(table),
    }


def ratios_to_pgqueuer(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each contender's p99 ÷ pgqueuer's at the same receiver and rate, per round: median and
    spread."""

    def cell(run: dict[str, Any]) -> tuple[int, str, int, float]:
        return run["round"], run["scenario"], run["delay_ms"], run["rate"]

    pgq = {cell(r): r["p99_ms"] for r in runs if r["contender"] == "pgqueuer" and r["p99_ms"]}
    found: dict[tuple[str, str, int, float], list[float]] = {}
    for run in runs:
        theirs = pgq.get(cell(run))
        if run["contender"] != "pgqueuer" and run["p99_ms"] is not None and theirs:
            found.setdefault(key(run), []).append(run["p99_ms"] / theirs)
    return [
        {
            "scenario": scenario,
            "contender": name,
            "delay_ms": delay,
            "rate": rate,
            "p99_vs_pgqueuer": round(median(values), 3),
            "low": round(min(values), 3),
            "high": round(max(values), 3),
        }
        for (scenario, name, delay, rate), values in sorted(found.items())
    ]


def highest_sustained(table: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per contender and receiver: the highest offered rate sustained in every round."""
    found: dict[str, dict[str, float | None]] = {}
    for row in table:
        if row["scenario"] != "steady":
            continue
        mine = found.setdefault(row["contender"], {}).setdefault(f"{row['delay_ms']}ms", None)
        if row["sustained"] and (mine is None or row["rate"] > mine):
            found[row["contender"]][f"{row['delay_ms']}ms"] = row["rate"]
    return found


def goals(table: list[dict[str, Any]]) -> dict[str, float]:
    """The judged figures this plan measured at their rate (bench.report judges them)."""
    return {name: row[figure] for name, (row, figure) in goal_rows(table).items() if offered(row)}


def goals_not_offered(table: list[dict[str, Any]]) -> dict[str, float]:
    """The goals whose rate the producers fell short of: the rate they offered instead (the
    queue's producers send a hint to the queue after each commit, and on a busy machine fall
    short). Such a figure says nothing of the goal's rate, so it is not judged."""
    return {
        name: row["achieved"] for name, (row, _) in goal_rows(table).items() if not offered(row)
    }


def offered(row: dict[str, Any]) -> bool:
    """Whether the producers kept to the row's rate (95 %)."""
    return bool(row.get("achieved", row["rate"]) >= 0.95 * row["rate"])


def goal_rows(table: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], str]]:
    """Each goal's row of the table, and the figure of it the goal judges."""
    found = {}
    for row in table:
        if row["scenario"] == "slow" and row["contender"] == "serve_postgres":
            found["latency_slow_receiver_request_p99_ms"] = (row, "request_p99_ms")
        for name, (rate, _) in GOALS.items():
            contender = name.removeprefix("latency_").removesuffix("_p99_ms")
            if (row["scenario"], row["contender"], row["delay_ms"], row["rate"]) == (
                "steady",
                contender,
                0,
                rate,
            ):
                found[name] = (row, "p99_ms")
    return {name: (row, figure) for name, (row, figure) in found.items() if row[figure] is not None}


# -- how the report shows it ------------------------------------------------------------------

LABELS = {
    "serve_postgres": "serve, NOTIFY",
    "serve_queue": "serve, queue",
    "functions": "Functions worker, queue",
    "pgqueuer": "pgqueuer",
}


def table_lines(section: dict[str, Any]) -> list[str]:
    """Rows of the benchmark's Markdown table: per contender and receiver, p50 / p99 at each
    rate (achieved rate where the producers fell short, ``*`` where not sustained)."""
    lines = []
    rows: dict[tuple[str, str, int], list[str]] = {}
    for row in section["table"]:
        cell = f"{row['p50_ms']:g} / {row['p99_ms']:g}" if row["p99_ms"] is not None else "-"
        if row["achieved"] < 0.95 * row["rate"]:
            cell += f" (offered {row['achieved']:,.0f})"
        if not row["sustained"]:
            cell += "*"
        if row["swept"]:
            cell += f" ({row['swept']} hints lost, swept)"
        if row["scenario"] == "slow":
            cell = f"request p99 {row['request_p99_ms']:g}; 2xx {cell}"
        rows.setdefault((row["scenario"], row["contender"], row["delay_ms"]), []).append(
            f"{row['rate']:,.0f}: {cell}"
        )
    for (scenario, name, delay), cells in rows.items():
        what = "commit → 2xx p50 / p99 ms" if scenario == "steady" else "slow receiver"
        lines.append(
            f"| latency, {LABELS.get(name, name)}, receiver {delay} ms: {what} at msg/s | "
            f"{'; '.join(cells)} | |"
        )
    for row in section["vs_pgqueuer"]:
        if row["scenario"] == "steady" and row["delay_ms"] == 0:
            lines.append(
                f"| latency p99 ÷ pgqueuer's, {LABELS.get(row['contender'])}, "
                f"{row['rate']:,.0f} msg/s, per round | {row['p99_vs_pgqueuer']:g} "
                f"({row['low']:g} to {row['high']:g}) | |"
            )
    for name, skipped in section.get("skipped", {}).items():
        lines.append(f"| latency, {name} | skipped: {skipped} | |")
    return lines


def plot_axis(ax: Any, section: dict[str, Any]) -> None:
    """p99 commit → 2xx against the rate the producers achieved (where they fell short of the
    offered rate, the point sits at what they achieved), per contender, the instant receiver
    (solid) and the 50 ms one (dashed), log scale, the goals as lines."""
    ax.set_title("commit → 2xx p99 by achieved rate (dashed: 50 ms receiver)")
    colours = dict(zip(LABELS, ("#4c78a8", "#f58518", "#54a24b", "#b279a2"), strict=True))
    for name, label in LABELS.items():
        for delay, style in ((0, "-"), (50, "--")):
            points = [
                (row["achieved"], row["p99_ms"])
                for row in section["table"]
                if (row["scenario"], row["contender"], row["delay_ms"]) == ("steady", name, delay)
                and row["p99_ms"] is not None
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                shown = label if delay == 0 else None
                ax.plot(xs, ys, style, marker="o", color=colours[name], label=shown)
    ax.axhline(50, color="red", linestyle=":", linewidth=1, label="goals: 50 ms, 1.5 s")
    ax.axhline(1500, color="red", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    offered = ", ".join(f"{r:,.0f}" for r in section["plan"]["rates"])
    ax.set_xlabel(f"msg/s the producers achieved (offered: {offered})")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
