"""``python -m outbox`` with two instruments, for tests that need to look inside the process.

    python -m tests.support.instrumented_relay [--clock-skew SECONDS] -- drain [--budget N]

``--clock-skew`` shifts this process's wall clock (``time.time``, ``time.time_ns`` and
``datetime.now``/``utcnow``) before the relay is imported, as if the worker's clock were wrong.
The monotonic clock is left alone: it has no epoch to be wrong about.
It prints ``start-rss-kib=<N>`` once the relay is imported, and ``peak-rss-kib=<N>`` (its peak
resident memory) on exit, both to stderr: the difference is what the run itself needed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from typing import Any

START_RSS = "start-rss-kib"
PEAK_RSS = "peak-rss-kib"


def skew_wall_clock(seconds: float) -> None:
    """Make every wall-clock reading of this process ``seconds`` off."""
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_time_ns() + int(seconds * 1e9)

    class SkewedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return super().now(tz) + dt.timedelta(seconds=seconds)

        @classmethod
        def utcnow(cls) -> Any:
            return cls.now(dt.UTC).replace(tzinfo=None)

    dt.datetime = SkewedDatetime  # type: ignore[misc]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clock-skew", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.clock_skew:
        skew_wall_clock(args.clock_skew)
    # After the skew: modules bind datetime at import.
    from outbox.hosting.cli import main as outbox_main

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    print(f"{START_RSS}={_memory_kib('VmRSS')}", file=sys.stderr, flush=True)
    try:
        return outbox_main(command)
    finally:
        print(f"{PEAK_RSS}={_memory_kib('VmHWM')}", file=sys.stderr, flush=True)


def _memory_kib(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak) of this process image, in KiB.

    Not ``getrusage().ru_maxrss``: Linux carries the parent's peak over fork and exec into it.
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reported_kib(stderr: str, name: str) -> int:
    """A ``name=<KiB>`` figure an instrumented relay printed on its stderr."""
    lines = [line for line in stderr.splitlines() if line.startswith(f"{name}=")]
    assert lines, f"no {name} line in: {stderr[-2000:]}"
    return int(lines[-1].split("=", 1)[1])


def memory_growth_kib(stderr: str) -> int:
    """How much the relay's resident memory grew from start-up to its peak."""
    return reported_kib(stderr, PEAK_RSS) - reported_kib(stderr, START_RSS)


if __name__ == "__main__":
    sys.exit(main())
