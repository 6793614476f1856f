"""The measurements' summary as Markdown tables (what the journal and docs/log-tailing.md quote)."""

from __future__ import annotations

from typing import Any


def _cell(figures: dict[str, Any] | None) -> str:
    if not figures:
        return "—"
    return f"{figures['median']:.2f} ({figures['min']:.2f}\u2013{figures['max']:.2f})"


def throughput(section: dict[str, Any]) -> list[str]:
    medians, ratios = section["medians"], section["ratios_to_poll"]
    lines = [
        f"Drains of {section['messages']:,} messages, {section['rounds']} rounds, "
        f"{section['concurrency']} requests in flight. Medians; ÷ poll: median of per-round "
        "ratios (range). All CPU: the relay's process, PostgreSQL's and the receiver's.",
        "",
        "| contender | msg/s | ÷ poll | relay CPU µs/msg | ÷ poll | PostgreSQL CPU µs/msg "
        "| ÷ poll | all CPU µs/msg | ÷ poll | drain WAL B/msg | ÷ poll | enqueue WAL B/msg |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, m in medians.items():
        r = ratios.get(name, {})
        lines.append(
            f"| {name} | {m['rate']:,.0f} | {_cell(r.get('rate'))} "
            f"| {m['worker_cpu_us_per_message']:.0f} | {_cell(r.get('worker_cpu_us_per_message'))} "
            f"| {m['postgres_cpu_us_per_message']:.1f} "
            f"| {_cell(r.get('postgres_cpu_us_per_message'))} "
            f"| {m['total_cpu_us_per_message']:.0f} | {_cell(r.get('total_cpu_us_per_message'))} "
            f"| {m['drain_wal_bytes_per_message']:,.0f} "
            f"| {_cell(r.get('drain_wal_bytes_per_message'))} "
            f"| {m['enqueue_wal_bytes_per_message']:,.0f} |"
        )
    return lines


def latency(section: dict[str, Any]) -> list[str]:
    app = section.get("app_updates", 0)
    lines = [
        f"{section['seconds']:g} s at each rate, {section['rounds']} rounds; medians of the "
        "rounds; relay's cost = the run's figure less the producer's alone (`produce`)."
        + (f" Each message's transaction also updates {app} application rows." if app else ""),
        "",
        "| rate | contender | achieved msg/s | p50 ms | p95 ms | p99 ms "
        "| PostgreSQL CPU µs/msg (relay's) | WAL B/msg (relay's) | relay process CPU µs/msg |",
        "|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for rate, figures in section["by_rate"].items():
        for name, m in figures["medians"].items():
            if name == "produce":
                lines.append(
                    f"| {rate}/s | produce alone | {m['offered_rate']:,.0f} | | | "
                    f"| {m['postgres_cpu_us_per_message']:.0f} "
                    f"| {m['wal_bytes_per_message']:,.0f} | |"
                )
                continue
            cost = m["relay_cost"]
            lines.append(
                f"| {rate}/s | {name} | {m['offered_rate']:,.0f} | {m['p50_ms']:.1f} "
                f"| {m['p95_ms']:.1f} | {m['p99_ms']:.1f} "
                f"| {m['postgres_cpu_us_per_message']:.0f} "
                f"({cost['postgres_cpu_us_per_message']:.0f}) "
                f"| {m['wal_bytes_per_message']:,.0f} ({cost['wal_bytes_per_message']:,.0f}) "
                f"| {m['relay_cpu_us_per_message']:.0f} |"
            )
    lines += ["", "Per-round ratios to poll (median, range):", ""]
    lines += [
        "| rate | contender | p50 | p99 | PostgreSQL CPU (all) | WAL (all) | relay's CPU, WAL |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    for rate, figures in section["by_rate"].items():
        for name, r in figures["ratios_to_poll"].items():
            cost = r.get("relay_cost", {})
            lines.append(
                f"| {rate}/s | {name} | {_cell(r.get('p50_ms'))} | {_cell(r.get('p99_ms'))} "
                f"| {_cell(r.get('postgres_cpu_us_per_message'))} "
                f"| {_cell(r.get('wal_bytes_per_message'))} "
                f"| {cost.get('postgres_cpu_us_per_message', float('nan')):.2f}, "
                f"{cost.get('wal_bytes_per_message', float('nan')):.2f} |"
            )
    return lines


def held(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| contender | messages | outbox_messages dead tuples | after VACUUM (not removable) "
        "| outbox_messages MB | slot's retained WAL MB |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in runs:
        slot = r["slot_after"] or {}
        retained = f"{slot['retained'] / 2**20:.1f}" if slot else "—"
        lines.append(
            f"| {r['contender']} | {r['messages']:,} | {r['outbox_dead_tuples']:,} "
            f"| {r['outbox_dead_after_vacuum']:,} "
            f"| {r['tables']['outbox_messages']['bytes'] / 2**20:.1f} | {retained} |"
        )
    return lines


def order(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| contender | keys | delivered in commit order | in created_at order |",
        "|---|--:|--:|--:|",
    ]
    lines += [
        f"| {r['contender']} | {r['keys']} | {r['commit_order']} | {r['created_at_order']} |"
        for r in runs
    ]
    return lines


def markdown(results: dict[str, Any]) -> str:
    parts: list[str] = []
    for title, name, render in (
        ("Throughput", "throughput", throughput),
        ("Commit → 2xx at a fixed rate", "latency", latency),
        ("A transaction held open", "held", held),
        ("Order", "order", order),
    ):
        if name in results:
            parts += [f"### {title}", "", *render(results[name]), ""]
    return "\n".join(parts)
