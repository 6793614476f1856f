"""Instructions per message: each contender's own work, counted by valgrind, whatever the machine.

CPU seconds per message move with everything else the machine runs. On two shared cores the
relay's process runs while PostgreSQL and the receiver run beside it and share the cores' caches
with it; the raw client runs beside the receiver only. The instructions a process executes do
not move: the same code, inputs and environment give the same count, whatever else runs.

Each contender drains ``small`` and then ``large`` messages under ``valgrind --tool=cachegrind``
(its own process only); instructions per message are the difference over ``large - small``, so
start-up and imports cancel out, and so does the cost of opening connections as long as both
drains open as many (each drain's count is reported: ``connections``). The raw client builds
and signs its requests before its clock starts: the same difference for runs that only build
them is taken off. Contenders: the raw client, the floor (``bench.worker floor``: lease,
build, sign, POST and record, nothing else), the relay, and the relay with its telemetry calls
taken out (``untraced``): what telemetry costs with no SDK is a few instructions per message,
which only a count can resolve; and the relay on uvloop's event loop (``serve --uvloop``).
Skipped where valgrind is not installed.

valgrind's CPU model hides the processor's SHA instructions, so the signature (which the relay and
the floor compute inside their count, the raw client outside) weighs more here than natively.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, Database, ReceiverProcess, log

CONTENDERS = ("raw", "floor", "relay", "untraced", "relay-uvloop")
_TOTAL = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def valgrind() -> str | None:
    return shutil.which("valgrind")


def count(command: list[str]) -> int:
    """Instructions the command's process executes (cachegrind, no cache simulation)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "cachegrind.out"
        done = subprocess.run(
            [
                valgrind() or "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                f"--cachegrind-out-file={out}",
                *command,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"valgrind run failed:\n{done.stderr[-4000:]}")
        found = _TOTAL.search(out.read_text())
    if found is None:
        raise RuntimeError("cachegrind wrote no instruction count")
    return int(found.group(1))


async def run_once(
    receiver: ReceiverProcess, contender: str, messages: int, concurrency: int = 16
) -> tuple[int, int]:
    """Instructions of one drain of ``messages`` (its requests only, for ``raw --build-only``)
    with ``concurrency`` requests in flight at most, and the connections it opened."""
    await receiver.reset()
    worker = [sys.executable, "-m", "bench.worker", "--url", receiver.url()]
    worker += ["--concurrency", str(concurrency)]
    if contender in ("raw", "raw-build"):
        command = [*worker, "raw", "--messages", str(messages)]
        if contender == "raw-build":
            return count([*command, "--build-only"]), 0
        total = count(command)
        return total, (await receiver.stats()).connections
    async with Database("instructions") as db:
        await db.backlog(messages)
        name, _, loop = contender.partition("-")  # relay-uvloop: the relay on uvloop
        command = [*worker, name, "--messages", str(messages), "--database-url", db.url]
        if loop:
            command.append(f"--{loop}")
        total = count(command)
    stats = await receiver.stats()
    if stats.distinct != messages:
        raise AssertionError(f"{contender}: receiver saw {stats.distinct} of {messages} messages")
    return total, stats.connections


async def measure(
    receiver: ReceiverProcess,
    *,
    small: int,
    large: int,
    concurrency: int = 16,
    contenders: tuple[str, ...] = CONTENDERS,
) -> dict[str, Any]:
    """Instructions per message of each of ``contenders`` (the raw client always among them:
    every ratio is to it), and the ratios between those counted."""
    if valgrind() is None:
        log("instructions: skipped, valgrind is not installed")
        return {"skipped": "valgrind is not installed"}
    per_message: dict[str, float] = {}
    # Per contender, the connections the smaller and the larger drain opened: a difference of
    # drains also counts what the larger opened beyond the smaller's.
    connections: dict[str, list[int]] = {}
    for contender in ("raw", *(c for c in contenders if c != "raw"), "raw-build"):
        low, opened_low = await run_once(receiver, contender, small, concurrency)
        high, opened_high = await run_once(receiver, contender, large, concurrency)
        per_message[contender] = (high - low) / (large - small)
        connections[contender] = [opened_low, opened_high]
        log(
            f"instructions: {contender} {per_message[contender]:,.0f} per message "
            f"(connections opened: {opened_low}, {opened_high})"
        )
    del connections["raw-build"]
    per_message["raw"] -= per_message.pop("raw-build")
    return {
        "small": small,
        "large": large,
        "concurrency": concurrency,
        "connections": connections,
        "per_message": {c: round(n) for c, n in per_message.items()},
        **ratios(per_message),
    }


# Each ratio reported: its numerator and denominator, and the digits it is rounded to.
RATIOS = {
    "relay_vs_raw": ("relay", "raw", 3),
    "floor_vs_raw": ("floor", "raw", 3),
    "relay_vs_floor": ("relay", "floor", 3),
    "relay_vs_untraced": ("relay", "untraced", 4),
    "uvloop_vs_asyncio": ("relay-uvloop", "relay", 3),
}


def ratios(per_message: dict[str, float]) -> dict[str, float]:
    """The ratios whose two contenders were counted."""
    return {
        name: round(per_message[top] / per_message[bottom], digits)
        for name, (top, bottom, digits) in RATIOS.items()
        if top in per_message and bottom in per_message
    }
