"""The webhooks' receiver and its ledgers: ``python -m bench.chaos.arrivals DIR``.

One receiver per run, started by ``harness.py`` before the replicas and stopped after them: it
stands in for the service the webhooks go to, which a relay's SIGKILL does not take down. (A
receiver inside each replica's process died with it, and in the instant between the receiver's
sockets closing and the relay's own death the relay saw its requests reset, counted them as
failures and opened the endpoint's circuit breaker, shared by every relay through the database:
the surviving replica then held its deliveries for the 10 s cool-down. That measured the test's
topology, not the relay.)

It is ``bench.receiver``'s HTTP server with the recorder below. Replica ``i``'s relay posts to
``/chaos/<i>``; each arrival is one line of ``DIR/arrivals-<i>.csv``::

    <arrived, unix s>,<webhook-id>,<enqueued, unix s>,<i>

written with a single ``write(2)`` before the 204 is sent, so a relay told of an arrival finds
it in the ledger. The ledgers are what each replica follows for its latency and rate
(``Tail``), what instance 0 follows to report duplicates a replica alone cannot see (``Fleet``:
a message first delivered by one relay may be delivered again by the other), and what the final
count reads (``bench.chaos.tally``).

Prints ``listening <port>`` once it accepts connections; asks the kernel to end it with its
parent (``PR_SET_PDEATHSIG``), so that an interrupted run leaves no receiver behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import time
from collections import deque
from pathlib import Path

from bench import receiver

PATH = re.compile(r"/chaos/([0-9]{1,3})")
# How long a duplicate is looked for after a message's first arrival, during the run: a relay's
# lease (60 s by default) expires, another relay takes the row and sends it again. The final
# count has no window.
DUPLICATE_WINDOW_SECONDS = 900.0
# Latency percentiles are over the arrivals of this last span, as the harness's adapters do.
LATENCY_WINDOW_SECONDS = 30.0
PR_SET_PDEATHSIG = 1


def ledger_path(directory: Path, instance: int | str) -> Path:
    return directory / f"arrivals-{instance}.csv"


class Recorder:
    """What ``bench.receiver.Connection`` asks of a recorder: the answer to each request.

    A POST to ``/chaos/<instance>`` is written to that instance's ledger and answered 204 after
    ``work_seconds`` (the harness's ``JOB_WORK_MS``: the receiver's work, after the arrival that
    is measured). Anything else is 404.
    """

    def __init__(self, directory: Path, work_seconds: float) -> None:
        self.directory = directory
        self.work_seconds = work_seconds
        self._ledgers: dict[str, int] = {}

    def answer(self, request: receiver.Request, connection: int) -> tuple[float, bytes]:
        matched = PATH.fullmatch(request.path)
        if request.method != "POST" or matched is None:
            return 0.0, receiver.NOT_FOUND
        arrived = time.time()
        enqueued = float(json.loads(request.body)["data"]["enqueuedAt"])
        instance = matched.group(1)
        line = f"{arrived:.6f},{request.webhook_id},{enqueued:.6f},{instance}\n"
        os.write(self._ledger(instance), line.encode())
        return self.work_seconds, receiver.NO_CONTENT

    def _ledger(self, instance: str) -> int:
        if instance not in self._ledgers:
            path = ledger_path(self.directory, instance)
            self._ledgers[instance] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._ledgers[instance]

    def arrived(self, request: receiver.Request, connection: int) -> None:
        """A delayed answer was sent: the arrival was recorded when the request came."""

    def abandoned(self, request: receiver.Request) -> None:
        """A delayed answer's connection was lost: nothing to undo."""


async def serve(directory: Path, work_seconds: float) -> None:
    recorder = Recorder(directory, work_seconds)
    ids = [0]
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: receiver.Connection(recorder, ids),  # duck-typed: answer, arrived, abandoned
        "127.0.0.1",
        0,
        backlog=1024,
    )
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def end_with_parent() -> None:
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        raise SystemExit(1)


class Tail:
    """The lines added to ledgers since the last read, whole lines only."""

    def __init__(self, paths: list[Path] | None = None, *, from_end: bool = False) -> None:
        self._offsets: dict[Path, int] = {}
        for path in paths or []:
            self._offsets[path] = path.stat().st_size if from_end and path.exists() else 0

    def read(self, path: Path) -> list[tuple[float, str, float]]:
        """(arrived, webhook id, enqueued) of each line ``path`` gained."""
        if not path.exists():
            return []
        with path.open("rb") as file:
            file.seek(self._offsets.get(path, 0))
            data = file.read()
        whole = data[: data.rfind(b"\n") + 1]
        self._offsets[path] = self._offsets.get(path, 0) + len(whole)
        rows = []
        for line in whole.decode().splitlines():
            arrived, webhook_id, enqueued, _ = line.split(",")
            rows.append((float(arrived), webhook_id, float(enqueued)))
        return rows


class Arrivals:
    """One replica's arrivals (those its relay sent), from its ledger: count and latencies."""

    def __init__(self, directory: Path, instance: int) -> None:
        self.path = ledger_path(directory, instance)
        self._tail = Tail([self.path], from_end=True)  # what earlier incarnations had is theirs
        self.received = 0
        self._latencies: deque[tuple[float, float]] = deque()  # (arrived, milliseconds)

    def poll(self) -> None:
        for arrived, _, enqueued in self._tail.read(self.path):
            self.received += 1
            self._latencies.append((arrived, (arrived - enqueued) * 1000))

    def recent_latencies(self) -> list[float]:
        """The latencies (ms) of the last ``LATENCY_WINDOW_SECONDS``."""
        horizon = time.time() - LATENCY_WINDOW_SECONDS
        while self._latencies and self._latencies[0][0] < horizon:
            self._latencies.popleft()
        return [latency for _, latency in self._latencies]


class Fleet:
    """Every replica's ledger, followed as it grows: unique messages and repeated deliveries.

    A repeat is an id seen again within ``DUPLICATE_WINDOW_SECONDS`` of its first arrival. Each
    poll's new lines are taken in arrival order, whichever ledger they are in; the ledgers are
    read from their start, so a restarted instance 0 counts from the run's start again.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.unique = 0
        self.repeats = 0
        self._tail = Tail()
        self._first: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()

    def poll(self) -> None:
        fresh: list[tuple[float, str]] = []
        for path in sorted(self.directory.glob("arrivals-*.csv")):
            fresh += [(arrived, webhook_id) for arrived, webhook_id, _ in self._tail.read(path)]
        for arrived, webhook_id in sorted(fresh):
            self._count(webhook_id, arrived)

    def _count(self, webhook_id: str, arrived: float) -> None:
        if webhook_id in self._first:
            self.repeats += 1
            return
        self.unique += 1
        self._first[webhook_id] = arrived
        self._order.append((arrived, webhook_id))
        horizon = arrived - DUPLICATE_WINDOW_SECONDS
        while self._order and self._order[0][0] < horizon:
            self._first.pop(self._order.popleft()[1], None)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.arrivals")
    parser.add_argument("directory", type=Path, help="where the ledgers go")
    parser.add_argument("--work-ms", type=float, default=1.0, help="wait before each 204 (1)")
    args = parser.parse_args()
    end_with_parent()
    args.directory.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.directory, args.work_ms / 1000))


if __name__ == "__main__":
    main()
