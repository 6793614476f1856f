"""Run hardbyte/postgresql-job-queue-benchmarking with the relay registered as system ``outbox``.

    python bench/chaos/harness.py HARNESS_DIR run --systems outbox \\
        --scenario chaos_crash_recovery --replicas 2 --producer-rate 300

Run by the harness's Python (3.12, its requirements installed; ``run.sh`` sets it up). Nothing of
the harness is copied or changed: this imports it from ``HARNESS_DIR`` and, before handing over to
its CLI (``bench_harness.orchestrator.main``), adds to what it has in memory:

- ``ADAPTERS["outbox"]``: the manifest ``bench/chaos/adapter.json``, no build step, and a launcher
  that starts ``python -m bench.chaos.adapter`` on this project's Python (``OUTBOX_PYTHON``,
  default ``.venv/bin/python``) in the project's folder, with the harness's environment
  (``_base_env``), ``OUTBOX_CHAOS_RECEIVER`` and ``OUTBOX_CHAOS_DIR``;
- the run's receiver (``python -m bench.chaos.arrivals``, on the same Python), started once the
  harness has made its run folder and stopped after the replicas, its ledgers in
  ``<run dir>/outbox``, where everything of ours goes;
- a record of what the harness does, in ``<run dir>/outbox/events.jsonl``: each phase's start, each
  replica's start and SIGKILL (with its pid, and whether its relay died with it) and the final
  stop, which ``bench.chaos.report`` needs to put arrivals into phases and explain duplicates.

These use names the harness does not publish (``_base_env``, ``_new_run_dir``, ``PhaseTracker``,
``ReplicaPool``): they are what commit ``93677ca`` has, the commit this was written against.

After the run it writes ``<run dir>/outbox/report.md`` (``bench.chaos.report``) and prints it;
the exit status is 1 when a message was lost, a duplicate is not explained by a kill, or the
count is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("OUTBOX_CHAOS_ROOT", HERE.parent.parent))
PINNED = "93677ca"
PDEATH_WAIT_SECONDS = 2.0


class Run:
    """The run the harness is making: its folder (once it has one), its receiver, the event
    log."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.directory: Path | None = None
        self.receiver: subprocess.Popen[str] | None = None
        self.receiver_url = ""

    @property
    def ledgers(self) -> Path:
        if self.directory is None:
            raise RuntimeError("the harness launched a replica before it made its run folder")
        return self.directory / "outbox"

    def start_receiver(self) -> None:
        self.receiver = subprocess.Popen(
            [self.python, "-m", "bench.chaos.arrivals", str(self.ledgers)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.receiver.stdout is not None
        listening = self.receiver.stdout.readline().split()
        if listening[:1] != ["listening"]:
            raise RuntimeError("the receiver (python -m bench.chaos.arrivals) did not start")
        self.receiver_url = f"http://127.0.0.1:{listening[1]}"

    def stop_receiver(self) -> None:
        if self.receiver is not None:
            self.receiver.terminate()
            self.receiver.wait(timeout=10)

    def record(self, event: str, **fields: Any) -> None:
        if self.directory is None:
            return
        line = json.dumps({"t": time.time(), "event": event, **fields})
        with (self.ledgers / "events.jsonl").open("a") as events:
            events.write(line + "\n")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (its relay)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still running (not zombies) after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        running = [pid for pid in pids if _running(pid)]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def register(adapters: Any, run: Run) -> None:
    """``ADAPTERS["outbox"]``: this project's adapter, launched natively."""

    def launch(manifest: Any, overrides: dict[str, str]) -> Any:
        env = adapters._base_env(manifest, overrides)
        env["OUTBOX_CHAOS_DIR"] = str(run.ledgers)
        env["OUTBOX_CHAOS_RECEIVER"] = run.receiver_url
        argv = [run.python, "-m", "bench.chaos.adapter"]
        return adapters.LaunchSpec(argv=argv, env=env, cwd=str(ROOT))

    adapters.ADAPTERS["outbox"] = adapters.AdapterEntry(
        bench_dir=HERE, builder=lambda skip: None, launcher=launch
    )


def observe(orchestrator: Any, replica_pool: Any, run: Run, harness: Path) -> None:
    """Wrap the harness's run folder, phase changes and replica lifecycle to record them."""
    new_run_dir = orchestrator._new_run_dir
    set_phase = orchestrator.PhaseTracker.set
    pool = replica_pool.ReplicaPool
    start_worker, kill_worker, stop_all = pool.start_worker, pool.kill_worker, pool.stop_all

    def made_run_dir(scenario: str | None) -> Path:
        run.directory = new_run_dir(scenario)
        run.ledgers.mkdir()
        run.record("run", load=os.getloadavg(), cpu=cpu_model(), harness=harness_commit(harness))
        run.start_receiver()
        return run.directory

    def phase(self: Any, label: str, type_str: str) -> None:
        set_phase(self, label, type_str)
        run.record("phase", label=label, type=type_str)

    def start(self: Any, instance_id: int) -> None:
        start_worker(self, instance_id)
        run.record("start", instance=instance_id, pid=self.slot(instance_id).process.pid)

    def kill(self: Any, instance_id: int, **kwargs: Any) -> None:
        process = self.slot(instance_id).process
        relays = children(process.pid) if process is not None else []
        run.record("kill", instance=instance_id, pid=process and process.pid, relays=relays)
        kill_worker(self, instance_id, **kwargs)
        run.record("killed", instance=instance_id, relays_alive=alive(relays, PDEATH_WAIT_SECONDS))

    def stop(self: Any, **kwargs: Any) -> None:
        run.record("stop", load=os.getloadavg())
        stop_all(self, **kwargs)

    orchestrator._new_run_dir = made_run_dir
    orchestrator.PhaseTracker.set = phase
    pool.start_worker, pool.kill_worker, pool.stop_all = start, kill, stop


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} x {os.cpu_count()}"
    return f"{os.cpu_count()} CPUs"


def harness_commit(harness: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(harness), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def main(harness: Path, argv: list[str]) -> int:
    sys.path[:0] = [str(ROOT), str(harness)]
    from bench_harness import adapters, orchestrator, replica_pool

    from bench.chaos import report

    commit = harness_commit(harness)
    if not commit.startswith(PINNED):
        print(f"[outbox] harness at {commit or '?'}, written for {PINNED}", file=sys.stderr)
    run = Run(os.environ.get("OUTBOX_PYTHON", str(ROOT / ".venv" / "bin" / "python")))
    register(adapters, run)
    observe(orchestrator, replica_pool, run, harness)
    try:
        code = orchestrator.main(argv)
    finally:
        run.stop_receiver()
        passed = run.directory is not None and report.write(run.directory)
    return code or (0 if passed else 1)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    raise SystemExit(main(Path(sys.argv[1]).resolve(), sys.argv[2:]))
