"""Summaries of a benchmark run: medians, ratios, targets, the JSON document, the plot, a table."""

from __future__ import annotations

import json
import os
import platform
import textwrap
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bench import latency
from bench.common import median

# relay ÷ raw and ÷ seed are still reported, no longer targets: on two shared cores, with
# PostgreSQL and the receiver on the same cores, the machine bounds them (docs/performance.md).
TARGETS = {
    "relay_vs_pgqueuer": 2.0,
    "worker_cpu_relay_vs_raw": 1.3,  # at most: the relay process's CPU per message
    # WAL per delivered message by the method the targets use (bench/walcost.py: a steady flow,
    # every byte of each message's life): at 3,000 and at 30,000 messages. The throughput
    # section's drain-only figure (wal_delivered_relay_vs_pgqueuer) is reported, not judged.
    "wal_flow_3000_relay_vs_pgqueuer": 0.6,  # at most
    "wal_flow_30000_relay_vs_pgqueuer": 0.6,  # at most
    "wal_enqueued_relay_vs_pgqueuer": 0.5,  # at most
    "postgres_cpu_relay_vs_pgqueuer": 0.6,  # at most
    "scaleout_wal_ratio": 1.3,  # at most: 8 racing relays ÷ one, per message
    "scaleout_postgres_cpu_ratio": 1.3,  # at most
    "scaleout_slowest_lease_ratio": 10.0,  # at most: slowest racing lease ÷ single median
    "fanout_wal_per_delivery_ratio": 1.3,  # at most: two endpoints ÷ one, per delivery
    "fanout_postgres_cpu_per_delivery_ratio": 1.3,  # at most
    "lease_large_vs_small": 2.0,  # at most
    "lease_held_vs_none": 2.0,  # at most
    "relay_peak_rss_mb": 200.0,  # at most
    "healthy_behind_dead_seconds": 12.0,  # at most
    "healthy_beside_dead_vs_alone": 3.0,  # at most: its time beside a blackholed one ÷ alone
    # Telemetry with no SDK costs at most 3 %: the relay's instructions per message ÷ those of
    # the relay with its telemetry calls removed (a throughput ratio cannot resolve 3 % here).
    "instructions_relay_vs_untraced": 1.03,
    # Latency-bound delivery: one relay process against receivers answering in 100 ms (fixed,
    # lognormal) ÷ the same process against the instant receiver, per round, steady rates (the
    # middle 80 % of each drain: bench/slow.py); the whole drains' rates; its peak RSS.
    "slow_100ms_vs_instant": 0.7,
    "lognormal_100ms_vs_instant": 0.7,
    "slow_100ms_rate": 2000.0,
    "lognormal_100ms_rate": 2000.0,
    "slow_peak_rss_mb": 200.0,  # at most
    # A new process after one that learned the endpoint's limit (relay/learned.py): its whole
    # drain to the lognormal receiver ÷ the instant receiver's (bench/slow.py, 40,000 messages),
    # and a new process's drain ÷ a warm one's to the same receiver (bench/coldwarm.py).
    "lognormal_100ms_learned_drain_vs_instant": 0.85,
    "coldwarm_cold_vs_warm": 0.85,
    # Push-back: the limited receiver's 429s per request it took; the steady one beside it.
    "pushback_refused_per_accepted": 0.25,  # at most
    # Latency under steady load (bench/latency.py), at most, ms: commit → 2xx p99 at 1,000
    # msg/s with an instant receiver; commit → request p99 at 200 msg/s, a 200 ms receiver.
    "latency_serve_postgres_p99_ms": 50.0,
    "latency_serve_queue_p99_ms": 1500.0,
    "latency_functions_p99_ms": 1500.0,
    "latency_slow_receiver_request_p99_ms": 50.0,
}
AT_MOST = {
    "latency_serve_postgres_p99_ms",
    "latency_serve_queue_p99_ms",
    "latency_functions_p99_ms",
    "latency_slow_receiver_request_p99_ms",
    "slow_peak_rss_mb",
    "pushback_refused_per_accepted",
    "instructions_relay_vs_untraced",
    "worker_cpu_relay_vs_raw",
    "wal_flow_3000_relay_vs_pgqueuer",
    "wal_flow_30000_relay_vs_pgqueuer",
    "wal_enqueued_relay_vs_pgqueuer",
    "postgres_cpu_relay_vs_pgqueuer",
    "scaleout_wal_ratio",
    "scaleout_postgres_cpu_ratio",
    "scaleout_slowest_lease_ratio",
    "fanout_wal_per_delivery_ratio",
    "fanout_postgres_cpu_per_delivery_ratio",
    "lease_large_vs_small",
    "lease_held_vs_none",
    "relay_peak_rss_mb",
    "healthy_behind_dead_seconds",
    "healthy_beside_dead_vs_alone",
}
LABELS = {
    "raw": "raw HTTP ceiling",
    "relay": "outbox-relay",
    "pgqueuer": "pgqueuer",
    "seed": "seed loop",
    "untraced": "outbox-relay, telemetry calls removed",
    "floor": "floor (lease, POST, record only)",
}


def machine() -> dict[str, Any]:
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    packages: dict[str, str | None] = {}
    for name in ("aiohttp", "asyncpg", "pgqueuer"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "system": platform.platform(),
        "packages": packages,
    }


def summarise_throughput(runs: list[dict[str, Any]]) -> dict[str, Any]:
    contenders = list(dict.fromkeys(run["contender"] for run in runs))
    rates = {c: median([r["rate"] for r in runs if r["contender"] == c]) for c in contenders}
    cpu = {
        c: {
            part: median([r["cpu_seconds"][part] for r in runs if r["contender"] == c])
            for part in ("worker", "receiver", "postgres")
        }
        for c in contenders
    }
    # Each ratio is the median of the per-round ratios (the same minutes of the same machine),
    # with their spread; not a ratio of medians taken in different minutes.
    by_round = per_round_ratios(runs)
    ratios = {name: round(median(values), 3) for name, values in by_round.items()}
    spread = {name: [min(values), max(values)] for name, values in by_round.items()}
    return {
        "runs": runs,
        "median_rate": rates,
        "ratios": ratios,
        "ratio_spread": spread,
        "per_round_ratios": by_round,
        "median_cpu_seconds": cpu,
        "cpu_bounds": cpu_bounds(runs, rates, os.cpu_count() or 1),
        "database": database_cost(runs, contenders),
    }


def database_cost(runs: list[dict[str, Any]], contenders: list[str]) -> dict[str, Any]:
    """Per contender (medians): WAL bytes per enqueued and per delivered message, PostgreSQL and
    own-process CPU per message; the ratios against pgqueuer and the raw client; and the relay's
    drain WAL by record type (from its median-WAL run)."""
    per: dict[str, dict[str, float]] = {}
    for c in contenders:
        mine = [r for r in runs if r["contender"] == c]
        per[c] = {
            "wal_bytes_per_enqueued": round(
                median([r["wal_bytes"]["enqueue"] / r["messages"] for r in mine]), 1
            ),
            "wal_bytes_per_delivered": round(
                median([r["wal_bytes"]["drain"] / r["messages"] for r in mine]), 1
            ),
            "postgres_cpu_us_per_message": round(
                median([r["cpu_seconds"]["postgres"] / r["messages"] for r in mine]) * 1e6, 1
            ),
            "worker_cpu_us_per_message": round(
                median([r["cpu_seconds"]["worker"] / r["messages"] for r in mine]) * 1e6, 1
            ),
        }
    ratios = {}
    relay, pgq, raw = per.get("relay"), per.get("pgqueuer"), per.get("raw")
    if relay and pgq:
        for name, key in (
            ("wal_delivered_relay_vs_pgqueuer", "wal_bytes_per_delivered"),
            ("wal_enqueued_relay_vs_pgqueuer", "wal_bytes_per_enqueued"),
            ("postgres_cpu_relay_vs_pgqueuer", "postgres_cpu_us_per_message"),
        ):
            if pgq[key]:
                ratios[name] = round(relay[key] / pgq[key], 3)
    if relay and raw and raw["worker_cpu_us_per_message"]:
        ratios["worker_cpu_relay_vs_raw"] = round(
            relay["worker_cpu_us_per_message"] / raw["worker_cpu_us_per_message"], 3
        )
    floor = per.get("floor")
    if floor and raw and raw["worker_cpu_us_per_message"]:
        # What any relay must do (lease, build, sign, POST, record) against the raw client.
        ratios["worker_cpu_floor_vs_raw"] = round(
            floor["worker_cpu_us_per_message"] / raw["worker_cpu_us_per_message"], 3
        )
    relay_runs = sorted(
        (r for r in runs if r["contender"] == "relay" and r.get("wal_record_types")),
        key=lambda r: r["wal_bytes"]["drain"],
    )
    record_types = relay_runs[len(relay_runs) // 2]["wal_record_types"] if relay_runs else None
    return {"per_contender": per, "ratios": ratios, "relay_wal_record_types": record_types}


def cpu_bounds(runs: list[dict[str, Any]], rates: dict[str, float], cores: int) -> dict[str, Any]:
    """What the CPU the processes used allows: no rate exceeds cores ÷ CPU seconds per message.

    Every process of a run (contender, receiver, PostgreSQL) shares this machine's cores, so a
    contender that needs ``c`` CPU seconds per message in all of them together cannot go faster
    than ``cores / c`` messages per second, however well it overlaps its work.
    """
    per_message = {
        c: {
            part: median(
                [r["cpu_seconds"][part] / r["messages"] for r in runs if r["contender"] == c]
            )
            * 1e6
            for part in ("worker", "receiver", "postgres")
        }
        for c in rates
    }
    bounds: dict[str, Any] = {
        "cores": cores,
        "cpu_us_per_message": {
            c: {part: round(us, 1) for part, us in parts.items()}
            for c, parts in per_message.items()
        },
    }
    # A contender's own process runs its Python code on one thread: it cannot beat one core ÷ its
    # own CPU per message, however idle the other cores are. busy: the share of its run it spent
    # on a core (the rest it waited: for answers, or for a core the others held).
    bounds["one_process"] = {
        c: {
            "max_rate": round(1e6 / parts["worker"]),
            "busy": round(
                median(
                    [
                        r["cpu_seconds"]["worker"] / r["worker_wall_seconds"]
                        for r in runs
                        if r["contender"] == c and r.get("worker_wall_seconds")
                    ]
                    or [0.0]
                ),
                3,
            ),
        }
        for c, parts in per_message.items()
        if parts["worker"] > 0
    }
    if "relay" in per_message:
        relay_bound = cores / (sum(per_message["relay"].values()) / 1e6)
        bounds["relay_max_rate"] = round(relay_bound)
        for other in ("raw", "seed"):
            if other in rates:
                bounds[f"relay_max_vs_{other}"] = round(relay_bound / rates[other], 3)
    if "relay" in per_message and "raw" in per_message:
        # A relay whose own process cost no more than the raw client, sending the same requests
        # (so the receiver's share is the raw run's) and doing this run's database work.
        raw, relay = per_message["raw"], per_message["relay"]
        ideal = cores / ((raw["worker"] + raw["receiver"] + relay["postgres"]) / 1e6)
        bounds["ideal_relay_max_rate"] = round(ideal)
        bounds["ideal_relay_max_vs_raw"] = round(ideal / rates["raw"], 3)
    return bounds


def per_round_ratios(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """relay ÷ each other contender within each round (the same minutes of the same machine)."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["contender"]] = run["rate"]
    ratios: dict[str, list[float]] = {}
    for rates in by_round.values():
        for other in ("raw", "pgqueuer", "seed", "untraced", "floor"):
            if "relay" in rates and other in rates:
                ratios.setdefault(f"relay_vs_{other}", []).append(
                    round(rates["relay"] / rates[other], 3)
                )
    return ratios


def database_figures(results: dict[str, Any]) -> dict[str, float]:
    """The database-cost ratios of a run: throughput's, scale-out's, fan-out's and the WAL
    method's."""
    found = dict(results.get("throughput", {}).get("database", {}).get("ratios", {}))
    if "scaleout" in results:
        for key in ("wal_ratio", "postgres_cpu_ratio", "slowest_lease_ratio"):
            found[f"scaleout_{key}"] = results["scaleout"][key]
    if "fanout" in results:
        for key in ("wal_per_delivery_ratio", "postgres_cpu_per_delivery_ratio"):
            found[f"fanout_{key}"] = results["fanout"][key]
    for row in results.get("walcost", {}).get("ratios", []):
        if row["variant"] == "flow":  # the method the WAL targets use (bench/walcost.py)
            ratio = row["whole_life_relay_vs_pgqueuer"]["median"]
            found[f"wal_flow_{row['messages']}_relay_vs_pgqueuer"] = ratio
    return found


def latency_bound_figures(results: dict[str, Any]) -> dict[str, float]:
    """The slow-receiver and push-back sections' judged figures."""
    found: dict[str, float] = {}
    if "slow" in results:
        slow = results["slow"]
        for name, ratio in slow["ratio_to_instant"].items():
            found[f"{name}_vs_instant"] = ratio["median"]
            found[f"{name}_rate"] = slow["median_rate"][name]
        found["slow_peak_rss_mb"] = slow["peak_rss_mb_max"]
        learned = slow["drain_ratio_to_instant"].get("lognormal_100ms_learned")
        if learned:
            found["lognormal_100ms_learned_drain_vs_instant"] = learned["median"]
    if "coldwarm" in results:
        found["coldwarm_cold_vs_warm"] = results["coldwarm"]["cold_vs_warm"]["median"]
    if "pushback" in results:
        found["pushback_refused_per_accepted"] = results["pushback"]["refused_per_accepted_median"]
    return found


def targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, float] = dict(results.get("throughput", {}).get("ratios", {}))
    found.update(database_figures(results))
    if "scale" in results:
        found["lease_large_vs_small"] = results["scale"]["ratio"]
    if "held_keys" in results:
        found["lease_held_vs_none"] = results["held_keys"]["ratio"]
    if "memory" in results:
        found["relay_peak_rss_mb"] = results["memory"]["peak_rss_mb_median"]
    if "isolation" in results:
        found["healthy_behind_dead_seconds"] = results["isolation"]["behind_dead_seconds_median"]
    if "beside" in results:
        found["healthy_beside_dead_vs_alone"] = results["beside"]["ratio_median"]
    found.update(latency_bound_figures(results))
    found.update({k: v for k, v in results.get("latency", {}).get("goals", {}).items() if v})
    if "relay_vs_untraced" in results.get("instructions", {}):
        found["instructions_relay_vs_untraced"] = results["instructions"]["relay_vs_untraced"]
    verdicts = {}
    for name, value in found.items():
        if name not in TARGETS:
            continue  # reported, not judged
        goal = TARGETS[name]
        at_most = name in AT_MOST
        verdicts[name] = {
            "value": value,
            "target": f"<= {goal:g}" if at_most else f">= {goal:g}",
            "met": value <= goal if at_most else value >= goal,
        }
    return verdicts


def document(config: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "config": config,
        **results,
        "targets": targets(results),
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def plot(path: Path, doc: dict[str, Any]) -> None:
    """One PNG: throughput, latency percentiles, lease time by table size, peak RSS, every
    judged ratio against its target, and the processes' own cost per message."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(12, 13))
    fig.suptitle(
        f"outbox-relay benchmark, {doc['date'][:10]}, {doc['machine']['cores']} cores "
        f"(medians; dots are single runs)"
    )
    _plot_throughput(axes[0][0], doc)
    _plot_latency(axes[0][1], doc)
    _plot_scale(axes[1][0], doc)
    _plot_memory(axes[1][1], doc)
    _plot_targets(axes[2][0], doc)
    _plot_process_cost(axes[2][1], doc)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_throughput(ax: Any, doc: dict[str, Any]) -> None:
    ax.set_title(f"throughput, {doc['config'].get('messages', 0):,} messages (msg/s)")
    if "throughput" not in doc:
        ax.set_axis_off()
        return
    rates = doc["throughput"]["median_rate"]
    names = list(rates)
    labels = [textwrap.fill(LABELS.get(n, n), 14) for n in names]
    bars = ax.bar(labels, [rates[n] for n in names], color="#4c78a8")
    ax.tick_params(axis="x", labelsize=7)
    for i, name in enumerate(names):
        points = [r["rate"] for r in doc["throughput"]["runs"] if r["contender"] == name]
        ax.scatter([i] * len(points), points, color="black", s=10, zorder=3)
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("messages / s")


def _plot_latency(ax: Any, doc: dict[str, Any]) -> None:
    if "latency" not in doc:
        ax.set_axis_off()
        return
    latency.plot_axis(ax, doc["latency"])


def _plot_scale(ax: Any, doc: dict[str, Any]) -> None:
    if "scale" not in doc:
        ax.set_axis_off()
        return
    scale = doc["scale"]
    ax.set_title(f"lease statement ({scale['batch_size']} rows), by finished rows in the table")
    sizes = [scale["small"], scale["large"]]
    bars = ax.bar([s["label"] for s in sizes], [s["lease_ms_median"] for s in sizes])
    for i, size in enumerate(sizes):
        ax.scatter([i] * len(size["lease_ms_runs"]), size["lease_ms_runs"], color="black", s=6)
    ax.bar_label(bars, fmt="%.2f ms")
    ax.set_ylabel("ms per statement")


# Short names of the judged figures, for the plot.
SHORT = {
    "relay_vs_pgqueuer": "throughput ÷ pgqueuer",
    "instructions_relay_vs_untraced": "instructions ÷ without telemetry",
    "worker_cpu_relay_vs_raw": "own CPU/msg ÷ raw client",
    "wal_flow_3000_relay_vs_pgqueuer": "WAL/delivered ÷ pgqueuer, 3k flow",
    "wal_flow_30000_relay_vs_pgqueuer": "WAL/delivered ÷ pgqueuer, 30k flow",
    "wal_enqueued_relay_vs_pgqueuer": "WAL/enqueued ÷ pgqueuer",
    "postgres_cpu_relay_vs_pgqueuer": "PostgreSQL CPU/msg ÷ pgqueuer",
    "scaleout_wal_ratio": "8 relays ÷ 1: WAL/msg",
    "scaleout_postgres_cpu_ratio": "8 relays ÷ 1: PostgreSQL CPU/msg",
    "scaleout_slowest_lease_ratio": "8 relays: slowest lease ÷ 1's median",
    "fanout_wal_per_delivery_ratio": "2 endpoints ÷ 1: WAL/delivery",
    "fanout_postgres_cpu_per_delivery_ratio": "2 endpoints ÷ 1: PG CPU/delivery",
    "lease_large_vs_small": "lease, 1M ÷ 10k rows",
    "lease_held_vs_none": "lease, held keys ÷ none",
    "relay_peak_rss_mb": "peak RSS (MB)",
    "healthy_behind_dead_seconds": "healthy behind dead (s)",
    "lognormal_100ms_learned_drain_vs_instant": "learned limit: lognormal drain ÷ instant",
    "coldwarm_cold_vs_warm": "a new process's drain ÷ a warm one's",
    "latency_serve_postgres_p99_ms": "serve NOTIFY p99 at 1k/s (ms)",
    "latency_serve_queue_p99_ms": "serve queue p99 at 1k/s (ms)",
    "latency_functions_p99_ms": "Functions p99 at 1k/s (ms)",
    "latency_slow_receiver_request_p99_ms": "200 ms receiver: commit → request p99",
}


def _plot_targets(ax: Any, doc: dict[str, Any]) -> None:
    """Every judged figure as a share of its target: at most 1 for an upper bound, at least 1
    for a lower bound (the value itself is written beside its bar)."""
    verdicts = [(k, v) for k, v in doc.get("targets", {}).items() if k in SHORT]
    if not verdicts:
        ax.set_axis_off()
        return
    ax.set_title("each judged figure ÷ its target (green: met)")
    names = [SHORT[k] for k, _ in verdicts]
    shares = [v["value"] / TARGETS[k] for k, v in verdicts]
    colors = ["#54a24b" if v["met"] else "#e45756" for _, v in verdicts]
    bars = ax.barh(names, shares, color=colors)
    ax.bar_label(bars, labels=[f"{v['value']:g} ({v['target']})" for _, v in verdicts], fontsize=7)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlim(0, max([*shares, 1.0]) * 1.6)


def _plot_process_cost(ax: Any, doc: dict[str, Any]) -> None:
    """The contender process's own cost per message against the raw client's: CPU seconds (as
    measured beside PostgreSQL and the receiver) and instructions (valgrind)."""
    cpu = doc.get("throughput", {}).get("database", {}).get("per_contender", {})
    counted = doc.get("instructions", {}).get("per_message", {})
    if not (cpu.get("raw") and cpu.get("relay")) and not counted.get("raw"):
        ax.set_axis_off()
        return
    ax.set_title("own cost per message ÷ the raw client's")
    groups: list[tuple[str, float]] = []
    if cpu.get("raw") and cpu.get("relay"):
        raw = cpu["raw"]["worker_cpu_us_per_message"]
        for name in ("floor", "relay"):
            if raw and name in cpu:
                share = cpu[name]["worker_cpu_us_per_message"] / raw
                groups.append((f"{name}\nCPU seconds", share))
    if counted.get("raw"):
        for name in ("floor", "relay"):
            if name in counted:
                groups.append((f"{name}\ninstructions", counted[name] / counted["raw"]))
    bars = ax.bar([g for g, _ in groups], [v for _, v in groups], color="#72b7b2")
    ax.bar_label(bars, fmt="%.2f")
    ax.axhline(TARGETS["worker_cpu_relay_vs_raw"], color="red", linestyle="--", label="target")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend()


def _plot_memory(ax: Any, doc: dict[str, Any]) -> None:
    if "memory" not in doc:
        ax.set_axis_off()
        return
    memory = doc["memory"]
    ax.set_title(f"relay peak RSS draining {memory['messages']:,} messages")
    runs = [run["peak_rss_mb"] for run in memory["runs"]]
    bars = ax.bar(["relay"], [memory["peak_rss_mb_median"]], color="#54a24b", width=0.4)
    ax.scatter([0] * len(runs), runs, color="black", s=10, zorder=3)
    ax.axhline(TARGETS["relay_peak_rss_mb"], color="red", linestyle="--", label="target")
    ax.bar_label(bars, fmt="%.0f MB")
    ax.set_ylabel("MB")
    ax.legend()


# Each judged figure's row label in the tables, in their order.
VERDICT_LABELS = {
    "relay_vs_pgqueuer": "relay ÷ pgqueuer",
    "instructions_relay_vs_untraced": "instructions per message, relay ÷ without telemetry",
    "worker_cpu_relay_vs_raw": "relay process CPU per message ÷ raw client's",
    "wal_flow_3000_relay_vs_pgqueuer": "WAL per delivered message, relay ÷ pgqueuer, a "
    "flow of 3,000 (the targets' method)",
    "wal_flow_30000_relay_vs_pgqueuer": "WAL per delivered message, relay ÷ pgqueuer, a "
    "flow of 30,000 (the targets' method)",
    "wal_enqueued_relay_vs_pgqueuer": "WAL per enqueued message, relay ÷ pgqueuer",
    "postgres_cpu_relay_vs_pgqueuer": "PostgreSQL CPU per message, relay ÷ pgqueuer",
    "scaleout_wal_ratio": "WAL per message, 8 racing relays ÷ one",
    "scaleout_postgres_cpu_ratio": "PostgreSQL CPU per message, 8 racing relays ÷ one",
    "scaleout_slowest_lease_ratio": "slowest lease of 8 racing relays ÷ one relay's median",
    "fanout_wal_per_delivery_ratio": "WAL per delivery, two endpoints ÷ one",
    "fanout_postgres_cpu_per_delivery_ratio": "PostgreSQL CPU per delivery, 2 endpoints ÷ 1",
    "lease_large_vs_small": "lease time, large ÷ small table",
    "lease_held_vs_none": "lease time, with ÷ without rows behind held keys",
    "relay_peak_rss_mb": "relay peak RSS (MB)",
    "healthy_behind_dead_seconds": "healthy endpoint's messages behind a dead one (s)",
    "slow_100ms_rate": "relay msg/s (whole drain), receiver answering in 100 ms",
    "lognormal_100ms_rate": "relay msg/s (whole drain), receiver lognormal around 100 ms",
    "slow_100ms_vs_instant": "100 ms receiver ÷ instant, same process, steady rate, per round",
    "lognormal_100ms_vs_instant": "lognormal receiver ÷ instant, steady rate, per round",
    "slow_peak_rss_mb": "relay peak RSS against slow receivers (MB)",
    "pushback_refused_per_accepted": "429s per request taken, receiver limited to 20 at once",
    "lognormal_100ms_learned_drain_vs_instant": "a new process after one that learned: "
    "whole drain to the lognormal receiver ÷ the instant receiver's",
    "coldwarm_cold_vs_warm": "a new process's whole drain ÷ a warm one's (lognormal)",
    "latency_serve_postgres_p99_ms": "serve, NOTIFY: commit → 2xx p99 at 1,000 msg/s (ms)",
    "latency_serve_queue_p99_ms": "serve, queue: commit → 2xx p99 at 1,000 msg/s (ms)",
    "latency_functions_p99_ms": "Functions worker: commit → 2xx p99 at 1,000 msg/s (ms)",
    "latency_slow_receiver_request_p99_ms": "serve, NOTIFY, 200 ms receiver at 200 msg/s: "
    "commit → request p99 (ms)",
}


def verdict_lines(verdicts: dict[str, dict[str, Any]], keys: tuple[str, ...] = ()) -> list[str]:
    """A table row per judged figure (of ``keys``, or all), met or missed."""
    lines = []
    for key, label in VERDICT_LABELS.items():
        if key in verdicts and (not keys or key in keys):
            verdict = verdicts[key]
            mark = "met" if verdict["met"] else "**missed**"
            lines.append(f"| {label} | {verdict['value']:g} | {verdict['target']} ({mark}) |")
    return lines


def table(doc: dict[str, Any]) -> str:
    """The README's short table, in Markdown."""
    lines = [
        f"Measured {doc['date'][:10]} on {doc['machine']['cores']} cores "
        f"({doc['machine']['cpu'] or 'unknown CPU'}), medians of "
        f"{doc['config'].get('rounds', '?')} runs.",
        "",
        "| figure | value | target |",
        "|---|---|---|",
    ]
    if "throughput" in doc:
        for name, rate in doc["throughput"]["median_rate"].items():
            lines.append(f"| {LABELS.get(name, name)} | {rate:,.0f} msg/s | |")
    lines += verdict_lines(doc["targets"])
    bounds = doc.get("throughput", {}).get("cpu_bounds", {})
    if "relay_max_rate" in bounds:
        vs_raw, vs_seed = bounds.get("relay_max_vs_raw", 0), bounds.get("relay_max_vs_seed", 0)
        lines.append(
            f"| CPU bound: relay as measured, every core busy | "
            f"{bounds['relay_max_rate']:,} msg/s (÷ raw {vs_raw:g}, ÷ seed {vs_seed:g}) | |"
        )
    if "ideal_relay_max_rate" in bounds:
        ideal, ideal_vs_raw = bounds["ideal_relay_max_rate"], bounds["ideal_relay_max_vs_raw"]
        lines.append(
            f"| CPU bound: relay costing no more than the raw client, plus its database work | "
            f"{ideal:,} msg/s (÷ raw {ideal_vs_raw:g}) | |"
        )
    one_process = bounds.get("one_process", {})
    if one_process:
        parts = [
            f"{LABELS.get(c, c)} {b['max_rate']:,} msg/s ({b['busy']:.0%} busy)"
            for c, b in one_process.items()
        ]
        lines.append(
            f"| one process's bound (one core ÷ its own CPU per message) | {'; '.join(parts)} | |"
        )
    lines += _process_cost_lines(doc)
    lines += _slow_drain_lines(doc)
    if "latency" in doc:
        lines += latency.table_lines(doc["latency"])
    return "\n".join(
        lines
        + _payload_lines(doc)
        + _endpoint_lines(doc)
        + _exporter_lines(doc)
        + _backlog_lines(doc)
        + _sustained_lines(doc)
        + _lease_lines(doc)
    )


def _slow_drain_lines(doc: dict[str, Any]) -> list[str]:
    """The slow section's whole drains beside its judged steady rates (not judged)."""
    slow = doc.get("slow")
    if not slow or "drain_ratio_to_instant" not in slow:
        return []
    parts = [
        f"{name} {ratio['median']:g} ({ratio['low']:.3g} to {ratio['high']:.3g})"
        for name, ratio in slow["drain_ratio_to_instant"].items()
    ]
    steady = slow["median_steady_rate"]
    return [
        f"| slow receivers, whole drains ÷ instant, per round (start and end included) | "
        f"{'; '.join(parts)} | |",
        "| slow receivers, steady msg/s: instant / 100 ms / lognormal | "
        + " / ".join(f"{steady[n]:,.0f}" for n in steady)
        + " | |",
    ]


def _backlog_lines(doc: dict[str, Any]) -> list[str]:
    """The big backlog: its drain's time and rate, the lease's p50 / p99 at start, middle, end."""
    section = doc.get("backlog")
    if not section:
        return []
    last = section["rounds"][-1]["lease_ms"]
    leases = ", ".join(f"{p} {last[p]['p50_ms']:g} / {last[p]['p99_ms']:g}" for p in last)
    return [
        f"| {section['messages']:,} due rows drained by one relay: seconds; msg/s; lease p50 / p99 "
        f"ms at start, middle, end | {section['seconds_median']:,.0f} s; "
        f"{section['rate_median']:,.0f}; {leases} | |"
    ]


def _sustained_lines(doc: dict[str, Any]) -> list[str]:
    """Minutes at a steady load: how flat the lease, the delivery and the table stayed."""
    section = doc.get("sustained")
    if not section:
        return []
    flat = section["flatness"]
    return [
        f"| {section['seconds']:g} s at {section['rate']:g} msg/s, autovacuum "
        f"{section['autovacuum']}, purge running: last ÷ first window, delivery p50 / p99, "
        f"lease p50 / p99; table largest ÷ smallest | "
        f"{flat['delivery_p50_last_vs_first']:g} / {flat['delivery_p99_last_vs_first']:g}; "
        f"{flat['lease_p50_last_vs_first']:g} / {flat['lease_p99_last_vs_first']:g}; "
        f"{flat['table_largest_vs_smallest']:g} | |"
    ]


def _exporter_lines(doc: dict[str, Any]) -> list[str]:
    """The OTLP exporter on, every delivery sampled and one in ten: rate and CPU ÷ no SDK's."""
    section = doc.get("exporter")
    if not section:
        return []
    lines = []
    for name, label in (
        ("otlp", "every delivery sampled"),
        ("otlp_sampled", "one in ten sampled"),
        ("otlp_unsampled", "none sampled (metrics)"),
    ):
        rate, cpu = section["rate_vs_no_sdk"][name], section["cpu_vs_no_sdk"][name]
        lines.append(
            f"| OTLP exporter on, {label}: msg/s ÷ no SDK's; CPU per message ÷ no SDK's | "
            f"{rate['median']:g} ({rate['low']:g} to {rate['high']:g}); "
            f"{cpu['median']:g} ({cpu['low']:g} to {cpu['high']:g}) | |"
        )
    return lines


def _endpoint_lines(doc: dict[str, Any]) -> list[str]:
    """Many endpoints: deliveries/s, relay CPU per delivery, peak RSS (medians, spread)."""
    section = doc.get("endpoints")
    if not section:
        return []
    rate, cpu, rss = (
        section[key] for key in ("rate_deliveries", "relay_cpu_us_per_delivery", "peak_rss_mb")
    )
    return [
        f"| {section['endpoints']:,} endpoints over {section['event_types']} event types (Zipf): "
        f"deliveries/s; relay CPU per delivery; peak RSS | "
        f"{rate['median']:,.0f} ({rate['low']:,.0f} to {rate['high']:,.0f}); "
        f"{cpu['median']:,.0f} µs; {rss['median']:,.0f} MB | |"
    ]


def _payload_lines(doc: dict[str, Any]) -> list[str]:
    """Per payload size: msg/s (÷ 1 KB's, per round), relay CPU and WAL per message."""
    section = doc.get("payloads")
    if not section:
        return []
    lines = []
    for name, size in section["sizes"].items():
        m = section["median"][name]
        vs = section["rate_vs_1kb"].get(name)
        ratio = f" (÷ 1 KB {vs['median']:g}, {vs['low']:g} to {vs['high']:g})" if vs else ""
        lines.append(
            f"| payload {size:,} B: msg/s{ratio}; relay CPU; WAL enqueue + drain | "
            f"{m['rate']['median']:,.0f}; {m['relay_cpu_us_per_message']['median']:,.0f} µs/msg; "
            f"{m['wal_enqueue_bytes_per_message']['median']:,.0f} + "
            f"{m['wal_drain_bytes_per_message']['median']:,.0f} B/msg | |"
        )
    return lines


def _process_cost_lines(doc: dict[str, Any]) -> list[str]:
    """The floor's CPU and the instruction counts, beside the relay's CPU ratio."""
    lines = []
    cost = doc.get("throughput", {}).get("database", {}).get("ratios", {})
    if "worker_cpu_floor_vs_raw" in cost:
        lines.append(
            f"| floor process CPU per message ÷ raw client's (what any relay must do) | "
            f"{cost['worker_cpu_floor_vs_raw']:g} | |"
        )
    counted = doc.get("instructions", {})
    if "per_message" in counted:
        n = counted["per_message"]
        lines.append(
            f"| instructions per message (valgrind): raw / floor / relay | "
            f"{n['raw']:,} / {n['floor']:,} / {n['relay']:,} (relay ÷ raw "
            f"{counted['relay_vs_raw']:g}, floor ÷ raw {counted['floor_vs_raw']:g}) | |"
        )
    if "uvloop_vs_asyncio" in counted:
        lines.append(
            f"| instructions per message, relay on uvloop ÷ on asyncio's loop | "
            f"{counted['uvloop_vs_asyncio']:g} | |"
        )
    return lines


def _lease_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    if "scale" in doc:
        s = doc["scale"]
        lines.append(
            f"| lease statement, {s['small']['label']} / {s['large']['label']} | "
            f"{s['small']['lease_ms_median']:g} / {s['large']['lease_ms_median']:g} ms | |"
        )
    if "held_keys" in doc:
        held = doc["held_keys"]
        parking = held["first_parking"]
        lines.append(
            f"| lease statement, {held['without']['label']} / {held['with']['label']} | "
            f"{held['without']['lease_ms_median']:g} / {held['with']['lease_ms_median']:g} ms "
            f"(ratio {held['ratio']:g}); parking {parking['rows']:,} rows the first time: "
            f"{parking['leases']} leases, {parking['seconds']:g} s | |"
        )
    if "others_beside_backlog" in doc.get("held_keys", {}):
        o = doc["held_keys"]["others_beside_backlog"]
        lines.append(
            f"| {o['others']} messages without a key and {o['others']} of other keys beside "
            f"{o['rows']:,} never-seen rows behind {o['keys']:,} held key(s): first leased | "
            f"{o['first_seconds']:g} s (lease {o['first_leases']}); all without a key "
            f"{o['all_unkeyed_seconds']:g} s, all of other keys {o['all_keyed_seconds']:g} s "
            f"({o['all_keyed_leases']} leases) | |"
        )
    if "console" in doc:
        c = doc["console"]
        pages = c["list"]
        slowest = max(pages, key=lambda name: pages[name]["ms_median"])
        lines.append(
            f"| console over {c['rows']:,} rows: first page with no filter / status=Failed / "
            f"slowest ({slowest}); overview | {pages['none']['ms_median']:g} / "
            f"{pages['status=Failed']['ms_median']:g} / {pages[slowest]['ms_median']:g} ms; "
            f"{c['overview']['ms_median']:g} ms | |"
        )
        lines.append(
            f"| console's indexes: WAL per message with ÷ without (an index over every row "
            f"instead); the backlog's index weighed, added ÷ as migrated | "
            f"{c['wal']['ratio']:g} ({c['wal']['every_row_ratio']:g}); "
            f"{c['wal'].get('backlog_order_ratio', float('nan')):g} | |"
        )
    lines += console_call_lines(doc)
    if "isolation" in doc:
        iso = doc["isolation"]
        lines.append(
            f"| {iso['healthy']:,} messages for a healthy endpoint, alone / behind "
            f"{iso['dead']:,} for one that never answers (timeout {iso['timeout_seconds']:g} s) | "
            f"{iso['alone_seconds_median']:g} / {iso['behind_dead_seconds_median']:g} s; the dead "
            f"endpoint got {iso['dead_requests_median']:g} requests, "
            f"{iso['failed_by_breaker']} failed | |"
        )
    if "beside" in doc:
        side = doc["beside"]
        low, high = side["ratio_spread"]
        lines.append(
            f"| {side['healthy']:,} messages for a healthy endpoint, alone / beside "
            f"{side['dead']:,} for a blackholed one (timeout {side['timeout_seconds']:g} s) | "
            f"{side['alone_seconds_median']:g} / {side['beside_dead_seconds_median']:g} s "
            f"(ratio {side['ratio_median']:g}, spread {low:g}-{high:g}) | <= 3 |"
        )
    return lines


def console_call_lines(doc: dict[str, Any]) -> list[str]:
    """The console's API calls over an incident's backlog: the slowest call, and the lists'
    largest sort (the whole backlog, where a list sorts it)."""
    section = doc.get("console_calls")
    if not section:
        return []
    calls, slowest = section["calls"], section["slowest"]
    sorts = {n: p["sorted_rows"] for n, p in section["plans"].items() if n.startswith("list")}
    most = max(sorts, key=lambda name: sorts[name]) if sorts else None
    sorted_part = f"; most rows a list sorts: {sorts[most]:,} ({most})" if most else ""
    skipped = f"; not served yet: {', '.join(section['skipped'])}" if section["skipped"] else ""
    return [
        f"| console API over {section['pending']:,} Pending: overview / first page / slowest "
        f"({slowest}), median (p95) of {section['rounds']} | "
        f"{calls['overview']['ms_median']:g} ({calls['overview']['ms_p95']:g}) / "
        f"{calls['list, no filter']['ms_median']:g} ({calls['list, no filter']['ms_p95']:g}) / "
        f"{calls[slowest]['ms_median']:g} ({calls[slowest]['ms_p95']:g}) ms{sorted_part}"
        f"{skipped} | < 1000 ms |"
    ]
