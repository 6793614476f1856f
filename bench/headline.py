"""The quick profile (``python -m bench --quick``, ``make bench-quick``) and its headline table.

The four figures a reader asks first, each as the median of per-round ratios with its spread,
in one sitting of under 30 minutes on the project's 2-core VM (17 minutes on 2026-12-07, shared):

- throughput: the relay ÷ pgqueuer draining the same backlog (the ``throughput`` section, 3
  rounds of 20,000, the two contenders only);
- latency at rates: commit → 2xx p99 of each way the relay runs ÷ pgqueuer's, at 100, 1,000 and
  3,000 msg/s, receivers of 0 and 50 ms (the ``latency`` section, 8 s a rate after 2 s, 2
  rounds), and the goals;
- cold against warm: a new process's drain ÷ a warm one's (``coldwarm``, 3 rounds of 20,000);
- WAL: per delivered message, relay ÷ pgqueuer by the method the targets use (``walcost``: a
  steady flow of 3,000 and of 30,000 messages, one round: WAL moves far less than times do,
  the relay's by about 1 % between sittings, pgqueuer's by up to 7 % at 30,000).

A goal at a rate is judged only where the producers kept to that rate (``latency.goals``).

Every section stays available at full length (``python -m bench``, ``make bench``); this module
also runs the two sections it adds (``coldwarm``, ``walcost``) there.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench import coldwarm, latency, report, walcost
from bench.common import ReceiverProcess

HEADLINE = ("throughput", "latency", "coldwarm", "walcost")
QUICK = {
    "contenders": "relay,pgqueuer",
    "messages": 20_000,
    "rounds": 3,
    "latency_seconds": 8.0,
    "latency_warmup": 2.0,
    "latency_rounds": 2,
    "coldwarm_messages": 20_000,
    "coldwarm_rounds": 3,
    "walcost_messages": "3000,30000",
    "walcost_rounds": 1,
}
SMOKE = {**coldwarm.SMOKE, **walcost.SMOKE}
# The goals the headline judges (bench.report's targets).
GOALS = (
    "relay_vs_pgqueuer",
    "latency_serve_postgres_p99_ms",
    "latency_serve_queue_p99_ms",
    "latency_functions_p99_ms",
    "latency_slow_receiver_request_p99_ms",
    "coldwarm_cold_vs_warm",
    "wal_flow_3000_relay_vs_pgqueuer",
    "wal_flow_30000_relay_vs_pgqueuer",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--coldwarm-messages", type=int, default=40_000, help="per drain, cold/warm section")
    add("--coldwarm-rounds", type=int, default=3)
    add("--walcost-messages", default="3000,30000", help="sizes of the WAL method's runs")
    add("--walcost-rate", type=float, default=walcost.RATE, help="the WAL method's msg/s")
    add("--walcost-rounds", type=int, default=1)
    add(
        "--walcost-variants",
        default=walcost.METHOD,
        help=f"the method and the reconciliation's variants: {', '.join(walcost.VARIANTS)}",
    )


def quick_skip(phases: tuple[str, ...]) -> str:
    """``--skip`` for the quick profile: every section but the headline's."""
    return ",".join(p for p in phases if p not in HEADLINE)


async def phases(
    args: argparse.Namespace, skip: set[str], receiver: ReceiverProcess
) -> dict[str, Any]:
    """The cold/warm and WAL sections."""
    results: dict[str, Any] = {}
    if "coldwarm" not in skip:
        results["coldwarm"] = await coldwarm.measure(
            receiver, messages=args.coldwarm_messages, rounds=args.coldwarm_rounds
        )
    if "walcost" not in skip:
        results["walcost"] = await walcost.measure(
            receiver,
            sizes=tuple(int(n) for n in args.walcost_messages.split(",")),
            variants=tuple(args.walcost_variants.split(",")),
            rounds=args.walcost_rounds,
            rate=args.walcost_rate,
        )
    return results


def table_lines(doc: dict[str, Any]) -> list[str]:
    """The cold/warm and WAL rows of the full run's table."""
    lines = []
    if "coldwarm" in doc:
        lines += coldwarm.table_lines(doc["coldwarm"])
    if "walcost" in doc:
        lines += walcost.table_lines(doc["walcost"])
    return lines


def table(doc: dict[str, Any]) -> str:
    """The headline, in Markdown."""
    machine = doc["machine"]
    load = doc.get("load_average", {})
    lines = [
        f"Measured {doc['date'][:16]} UTC on {machine['cores']} cores ({machine['cpu']}); load "
        f"average (1, 5, 15 min) {_load(load.get('start'))} at the start, "
        f"{_load(load.get('end'))} at the end. Ratios: medians of per-round ratios (lowest to "
        "highest).",
        "",
        "| figure | ratio | as measured | rounds |",
        "|---|---|---|---|",
    ]
    lines += _throughput(doc) + _latency(doc) + _coldwarm(doc) + _wal(doc)
    return "\n".join(lines + _goals(doc))


def _goals(doc: dict[str, Any]) -> list[str]:
    """The issue's goals among the figures measured: met or missed, and the latency goals not
    judged where the producers fell short of the goal's rate."""
    lines = report.verdict_lines(doc.get("targets", {}), GOALS)
    for name, achieved in doc.get("latency", {}).get("goals_not_offered", {}).items():
        lines.append(
            f"| {report.VERDICT_LABELS[name]} | not judged: the producers offered "
            f"{achieved:,.0f} msg/s | <= {report.TARGETS[name]:g} |"
        )
    if not lines:
        return []
    return ["", "| goal | value | target |", "|---|---|---|", *lines]


def _load(values: Any) -> str:
    return " / ".join(f"{v:.1f}" for v in values) if values else "?"


def _range(found: dict[str, float]) -> str:
    return f"{found['median']:g} ({found['low']:g} to {found['high']:g})"


def _throughput(doc: dict[str, Any]) -> list[str]:
    section = doc.get("throughput")
    if not section or "relay_vs_pgqueuer" not in section["ratios"]:
        return []
    low, high = section["ratio_spread"]["relay_vs_pgqueuer"]
    ratio = {"median": section["ratios"]["relay_vs_pgqueuer"], "low": low, "high": high}
    rates = section["median_rate"]
    rounds = len(section["per_round_ratios"]["relay_vs_pgqueuer"])
    return [
        f"| throughput, relay ÷ pgqueuer ({doc['config']['messages']:,} messages) | "
        f"{_range(ratio)} | {rates['relay']:,.0f} / {rates['pgqueuer']:,.0f} msg/s | {rounds} |"
    ]


def _latency(doc: dict[str, Any]) -> list[str]:
    section = doc.get("latency")
    if not section:
        return []
    rows = {
        (r["contender"], r["delay_ms"], r["rate"]): r
        for r in section["table"]
        if r["scenario"] == "steady"
    }
    lines = []
    for ratio in section["vs_pgqueuer"]:
        if ratio["scenario"] != "steady":
            continue
        name, delay, rate = ratio["contender"], ratio["delay_ms"], ratio["rate"]
        mine, theirs = rows[(name, delay, rate)], rows.get(("pgqueuer", delay, rate), {})
        found = {"median": ratio["p99_vs_pgqueuer"], "low": ratio["low"], "high": ratio["high"]}
        lines.append(
            f"| latency p99 ÷ pgqueuer's: {latency.LABELS[name]}, {rate:,.0f} msg/s, receiver "
            f"{delay} ms | {_range(found)} | p50 / p99 {mine['p50_ms']:g} / {mine['p99_ms']:g} "
            f"ms against {theirs.get('p50_ms', 0):g} / {theirs.get('p99_ms', 0):g}; offered "
            f"{mine['achieved']:,.0f} msg/s{'' if mine['sustained'] else ', not sustained'} | "
            f"{mine['rounds']} |"
        )
    for row in section["table"]:
        if row["scenario"] == "slow":
            lines.append(
                f"| latency, receiver of {row['delay_ms']} ms at {row['rate']:g} msg/s: "
                f"{latency.LABELS[row['contender']]} | | commit → request p99 "
                f"{row['request_p99_ms']:g} ms | {row['rounds']} |"
            )
    return lines


def _coldwarm(doc: dict[str, Any]) -> list[str]:
    section = doc.get("coldwarm")
    if not section:
        return []
    rates, rounds = section["median_rate"], len(section["rounds"])
    return [
        f"| a new process's drain ÷ a warm one's ({section['messages']:,} messages, lognormal "
        f"~100 ms receiver) | {_range(section['cold_vs_warm'])} | {rates['cold']:,.0f} / "
        f"{rates['warm']:,.0f} msg/s; in a new database {_range(section['first_vs_warm'])} | "
        f"{rounds} |"
    ]


def _wal(doc: dict[str, Any]) -> list[str]:
    section = doc.get("walcost")
    if not section:
        return []
    lines = []
    for row in section["ratios"]:
        if row["variant"] != walcost.METHOD:
            continue
        whole = row["whole_life_bytes"]
        rounds = sum(
            1
            for r in section["runs"]
            if r["contender"] == "relay" and r["messages"] == row["messages"]
        )
        lines.append(
            f"| WAL per delivered message, relay ÷ pgqueuer ({row['messages']:,} messages, "
            f"{section['rate']:g} msg/s) | {_range(row['whole_life_relay_vs_pgqueuer'])} | "
            f"{whole['relay']:,.0f} / {whole['pgqueuer']:,.0f} B; the consumers' part "
            f"{row['delivered_relay_vs_pgqueuer']['median']:g} | {rounds} |"
        )
    return lines
