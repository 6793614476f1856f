"""A chaos run's table, phase by phase, with the exact count: ``python -m bench.chaos.report RUN``.

``RUN`` is a results folder of the harness (``<harness>/results/<scenario>-<time>-<id>``). The
latencies and rates are the harness's own summary (``summary.json``: per phase, the median of
the samples, rates summed over the replicas); lost messages and duplicate deliveries are the
adapter's exact count (``outbox/tally.json``), put into phases by time: a lost message into the
phase it was enqueued in, a duplicate into the phase of its first arrival.

Every duplicate is explained or called unexplained:

- **SIGKILL**: its first arrival was sent by a replica that the harness SIGKILLed within
  ``KILL_WINDOW_SECONDS`` after: that relay had the 204 but died before recording it, and a relay
  sent the message again once the lease ran out;
- **database kill**: its first arrival was during a ``pg-backend-kill`` or ``postgres-restart``
  phase (or within ``DATABASE_MARGIN_SECONDS`` after): the relay's session was terminated, or the
  server stopped, before the outcome was written.

Only the standard library: it runs on the harness's Python (``harness.py`` calls ``write``) as
well as on the project's.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KILL_WINDOW_SECONDS = 10.0
DATABASE_CHAOS = ("pg-backend-kill", "postgres-restart")
DATABASE_MARGIN_SECONDS = 2.0
LISTED = 30
# Each duplicated message with its cause and the details (``explain``).
Explained = list[tuple[dict[str, Any], tuple[str, str]]]


@dataclass(frozen=True)
class Phase:
    label: str
    type: str
    seconds: int
    start: float
    end: float


@dataclass(frozen=True)
class Run:
    """What the harness and the adapter left in a results folder."""

    directory: Path
    summary: dict[str, Any]
    manifest: dict[str, Any]
    events: list[dict[str, Any]]
    tally: dict[str, Any] | None

    @classmethod
    def load(cls, directory: Path) -> Run:
        ledgers = directory / "outbox"
        events_path, tally_path = ledgers / "events.jsonl", ledgers / "tally.json"
        events = [json.loads(line) for line in events_path.read_text().splitlines()]
        return cls(
            directory=directory,
            summary=_json(directory / "summary.json") or {},
            manifest=_json(directory / "manifest.json") or {},
            events=events,
            tally=_json(tally_path),
        )

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [event for event in self.events if event["event"] == kind]

    def phases(self) -> list[Phase]:
        """Each phase with its start and end, from the harness's recorded phase changes."""
        starts = {event["label"]: event["t"] for event in self.of("phase")}  # the last wins
        stops = self.of("stop")
        end = stops[-1]["t"] if stops else max(event["t"] for event in self.events)
        planned = self.summary.get("phases") or self.manifest.get("phases") or []
        phases: list[Phase] = []
        for spec in reversed(planned):
            start = starts.get(spec["label"], end)
            phases.insert(0, Phase(spec["label"], spec["type"], spec["duration_s"], start, end))
            end = start
        return phases

    def phase_metrics(self, label: str) -> dict[str, Any]:
        system = self.summary.get("systems", {}).get("outbox", {})
        return dict(system.get("phases", {}).get(label, {}))


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def phase_at(phases: list[Phase], moment: float) -> Phase | None:
    for phase in phases:
        if phase.start <= moment < phase.end:
            return phase
    return None


def explain(duplicate: dict[str, Any], run: Run, phases: list[Phase]) -> tuple[str, str]:
    """Why a message arrived more than once: (cause, details); the cause "unexplained" if no
    kill explains it."""
    first, instance = duplicate["arrived"][0], int(duplicate["sources"][0])
    for kill in run.of("kill"):
        if kill["instance"] == instance and 0 <= kill["t"] - first <= KILL_WINDOW_SECONDS:
            after = kill["t"] - first
            return "SIGKILL", f"replica {instance} SIGKILLed {after:.2f} s after the first arrival"
    for moment in (first, first - DATABASE_MARGIN_SECONDS):
        phase = phase_at(phases, moment)
        if phase is not None and phase.type in DATABASE_CHAOS:
            return phase.type, f"first arrival during {phase.label} ({phase.type})"
    return "unexplained", "no kill of its relay, no database kill at the time"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _metric(metrics: dict[str, Any], name: str, which: str) -> float | None:
    return metrics.get("metrics", {}).get(name, {}).get(which)


def phase_rows(run: Run, phases: list[Phase], explained: Explained) -> list[str]:
    lost = (run.tally or {}).get("lost_messages", [])
    rows = [
        "| phase | type | s | claim p50 ms | claim p99 ms (median / peak) | delivered/s "
        "| enqueued/s | lost | duplicates | harness jobs_lost (estimate) | recovery s |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|--:|--:|",
    ]
    for phase in phases:
        metrics = run.phase_metrics(phase.label)
        p99 = (_metric(metrics, "claim_p99_ms", "median"), _metric(metrics, "claim_p99_ms", "peak"))
        lost_here = sum(1 for row in lost if phase_at(phases, row["enqueued"]) is phase)
        causes = [why[0] for dup, why in explained if phase_at(phases, dup["arrived"][0]) is phase]
        duplicates = str(len(causes))
        if causes:
            duplicates += (
                " (" + ", ".join(f"{causes.count(c)} {c}" for c in sorted(set(causes))) + ")"
            )
        estimate, recovery = metrics.get("jobs_lost"), metrics.get("chaos_recovery_time_s")
        rows.append(
            f"| {phase.label} | {phase.type} | {phase.seconds} "
            f"| {_ms(_metric(metrics, 'claim_p50_ms', 'median'))} "
            f"| {_ms(p99[0])} / {_ms(p99[1])} | {_rate(metrics.get('median_throughput_per_s'))} "
            f"| {_rate(metrics.get('median_enqueue_rate_per_s'))} | {lost_here} | {duplicates} "
            f"| {'—' if estimate is None else f'{estimate:.0f}'} "
            f"| {'—' if recovery is None else f'{recovery:.0f}'} |"
        )
    return rows


def header(run: Run) -> list[str]:
    host = run.manifest.get("host", {})
    started = run.of("run")[0] if run.of("run") else {}
    stops = run.of("stop")
    adapter = run.manifest.get("adapters", {}).get("outbox", {})
    memory = host.get("memory_bytes", 0) / 2**30
    load_end = stops[-1]["load"] if stops else None
    return [
        f"# {run.directory.name}",
        "",
        f"- started {_utc(started.get('t'))}; machine: "
        f"{started.get('cpu', '?')}, {memory:.0f} GiB, {host.get('os', '?')}",
        f"- load average (1, 5, 15 min) at the start {_load(started.get('load'))}, "
        f"at the stop {_load(load_end)}",
        f"- harness {started.get('harness') or 'not a git checkout'}; "
        f"outbox {adapter.get('version', '?')}; "
        f"{run.manifest.get('postgres', {}).get('version', '?').split(' on ')[0]}",
        f"- `{' '.join(run.manifest.get('cli', []))}`",
    ]


def _utc(moment: float | None) -> str:
    if moment is None:
        return "?"
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _load(load: list[float] | None) -> str:
    return "?" if not load else " / ".join(f"{value:.2f}" for value in load)


def count_lines(run: Run, explained: Explained) -> tuple[list[str], bool]:
    """The exact count and whether the run passed."""
    tally = run.tally
    if not tally or "error" in tally:
        reason = tally["error"] if tally else "no outbox/tally.json (instance 0 did not stop?)"
        return [f"**No count**: {reason}."], False
    survivors = [pid for event in run.of("killed") for pid in event["relays_alive"]]
    unexplained = sum(1 for _, why in explained if why[0] == "unexplained")
    restarts = (
        max(
            (_metric(run.phase_metrics(p.label), "relay_restarts_total", "peak") or 0)
            for p in run.phases()
        )
        if run.phases()
        else 0
    )
    passed = not (
        tally["lost"] or tally["unknown_arrivals"] or unexplained or survivors or restarts
    ) and (tally["drained_in_s"] is not None)
    drained = (
        f"in {tally['drained_in_s']} s"
        if tally["drained_in_s"] is not None
        else f"NOT within {tally['drain_limit_s']} s"
    )
    lines = [
        f"**{'PASS' if passed else 'FAIL'}**: {tally['committed']:,} messages committed, "
        f"{tally['delivered_unique']:,} delivered ({tally['arrivals']:,} webhooks), "
        f"**{tally['lost']} lost**, **{tally['duplicate_deliveries']} duplicate deliveries** "
        f"({len(explained) - unexplained} of {len(explained)} messages explained by a kill), "
        f"{tally['unknown_arrivals']} unknown arrivals; drained {drained} after the stop; "
        f"statuses {tally['statuses']}.",
        f"- SIGKILLs: {len(run.of('kill'))}; relays alive after their adapter's SIGKILL: "
        f"{len(survivors)}; relay restarts (`outbox serve` exiting on its own): {restarts:.0f}",
    ]
    return lines, passed


def detail_lines(run: Run, phases: list[Phase], explained: Explained) -> list[str]:
    t0 = phases[0].start if phases else 0.0
    lines: list[str] = []
    for row in (run.tally or {}).get("lost_messages", [])[:LISTED]:
        where = phase_at(phases, row["enqueued"])
        lines.append(
            f"- lost {row['id']} ({row['status']}), enqueued at +{row['enqueued'] - t0:.1f} s "
            f"({where.label if where else '?'})"
        )
    for duplicate, why in explained[:LISTED]:
        arrivals = ", ".join(
            f"+{at - t0:.2f} s from replica {source}"
            for at, source in zip(duplicate["arrived"], duplicate["sources"], strict=True)
        )
        lines.append(f"- duplicate {duplicate['id']}: {arrivals}: {why[0]}: {why[1]}")
    return lines


def render(run: Run) -> tuple[str, bool]:
    phases = run.phases()
    duplicates = (run.tally or {}).get("duplicates", [])
    explained = [(duplicate, explain(duplicate, run, phases)) for duplicate in duplicates]
    counted, passed = count_lines(run, explained)
    lines = [*header(run), "", *counted, "", *phase_rows(run, phases, explained)]
    details = detail_lines(run, phases, explained)
    if details:
        lines += ["", "Times from the first phase's start.", ""]
        lines += details
    return "\n".join(lines) + "\n", passed


def write(directory: Path) -> bool:
    """Writes ``outbox/report.md`` into the results folder, prints it; whether the run passed."""
    text, passed = render(Run.load(directory))
    (directory / "outbox" / "report.md").write_text(text)
    print(text)
    return passed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    raise SystemExit(0 if write(Path(sys.argv[1])) else 1)
