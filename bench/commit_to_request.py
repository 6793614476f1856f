"""Commit → request at a moderate rate against a slow receiver (issue 45, its third "Why").

    python -m bench.commit_to_request [--rate 200] [--seconds 20] [--delay-ms 200]
                                      [--max-concurrency 32] [--concurrency N] [--rounds 3]

``outbox serve`` with ``OUTBOX_WAKEUP=postgres`` (a process of its own, on the benchmark's private
PostgreSQL) relays what a producer commits at a steady rate, one message per transaction, each
followed by its NOTIFY; the receiver (a process of its own) answers every request after
``--delay-ms``. The producer stamps ``at`` (unix seconds) into each payload just before its
commit; the receiver keeps each request's arrival (one machine, one clock). The relay process is
traced: each message's lease (when its lease statement returned, and how many it leased) and the
start of its request (when the publisher was called), so that the time from commit to request
splits into commit → lease → request started → arrived.

Reported per round, over the messages committed after ``--warm-up`` seconds (the endpoint's
limit of requests in flight grows from 16 in a fresh process): commit → arrival p50 / p95 / p99 /
max, the same for each part, the lease sizes, and the receiver's most requests in flight.
Against a receiver of ``d`` seconds, a rate ``r`` needs ``r * d`` requests in flight; where
``max_concurrency`` is below that, the backlog grows whatever the relay does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

import outbox
from bench.common import EVENT_TYPE, ROOT, SECRET, Database, bench_server, log, percentile
from tests.support.azure import free_port


class Receiver:
    """Answers every POST after ``delay`` seconds; keeps each one's arrival and commit time. It
    runs as a process of its own (``--receiver``), so that the producer's CPU does not delay its
    answers; on SIGTERM it writes what it kept to ``out``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.arrivals: dict[str, tuple[float, float]] = {}  # webhook id → (arrived, committed)
        self.in_flight = 0
        self.max_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        arrived = time.time()
        body = json.loads(await request.read())
        self.arrivals.setdefault(request.headers["webhook-id"], (arrived, body["data"]["at"]))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        return web.Response(status=204)

    async def serve(self, port: int, out: Path) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await stopping.wait()
        await runner.cleanup()
        kept = {"arrivals": self.arrivals, "max_in_flight": self.max_in_flight}
        out.write_text(json.dumps(kept))


def start_receiver(delay_ms: int, folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The receiver's process, once it accepts connections; its port."""
    port = free_port()
    command = [sys.executable, "-m", "bench.commit_to_request", "--receiver", str(port)]
    command += ["--delay-ms", str(delay_ms), "--out", str(folder / "arrivals.json")]
    receiver = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return receiver, port
        except OSError:
            if receiver.poll() is not None or time.monotonic() > deadline:
                receiver.kill()
                raise RuntimeError("the receiver did not start") from None
            time.sleep(0.1)


async def delivered(db_url: str, count: int, within: float) -> None:
    """Until ``count`` messages are Processed (their answers recorded), at most ``within`` s."""
    conn = await asyncpg.connect(db_url)
    try:
        deadline = time.monotonic() + within
        statement = "SELECT count(*) FROM outbox_messages WHERE status = 'Processed'"
        while await conn.fetchval(statement) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"not every message was delivered within {within:g} s")
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def produce(pool: Any, rate: float, seconds: float) -> int:
    """One message per transaction at ``rate`` per second, on schedule; how many."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    count = int(rate * seconds)

    async def one(i: int) -> None:
        async with pool.acquire() as conn, outbox.transaction(conn) as tx:
            await tx.enqueue(EVENT_TYPE, {"i": i, "at": time.time()})

    tasks = []
    for i in range(count):
        await asyncio.sleep(max(0.0, started + i / rate - loop.time()))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return count


def start_relay(env: dict[str, str], trace: Path) -> subprocess.Popen[bytes]:
    """The traced ``outbox serve``, once it serves (its log beside the trace)."""
    log_path = trace.with_suffix(".log")
    with log_path.open("wb") as output:
        relay = subprocess.Popen(
            [sys.executable, "-m", "bench.commit_to_request", "--traced-relay", str(trace)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while b"serving" not in log_path.read_bytes():
        if relay.poll() is not None or time.monotonic() > deadline:
            relay.kill()
            raise RuntimeError(f"the relay did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    return relay


async def run_round(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="commit-to-request-"))
    receiver, port = start_receiver(args.delay_ms, folder)
    endpoint: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/hook", "secret": SECRET}
    if args.max_concurrency:
        endpoint["max_concurrency"] = args.max_concurrency
    try:
        async with Database("commit_to_request") as db:
            await db.migrate()
            env = {
                "OUTBOX_DATABASE_URL": db.url,
                "OUTBOX_WEBHOOKS": json.dumps({EVENT_TYPE: endpoint}),
                "OUTBOX_WAKEUP": "postgres",
                "OUTBOX_PORT": str(free_port()),
            }
            if args.concurrency:
                env["OUTBOX_CONCURRENCY"] = str(args.concurrency)
            os.environ["OUTBOX_WAKEUP"] = "postgres"  # this process's producer NOTIFYs too
            relay = start_relay(env, folder / "trace.json")
            pool = await asyncpg.create_pool(db.url, min_size=8, max_size=8)
            try:
                await delivered(db.url, await produce(pool, args.rate, args.seconds), 60)
            finally:
                await pool.close()
                relay.send_signal(signal.SIGTERM)
                await asyncio.to_thread(relay.wait, 30)
    finally:
        receiver.send_signal(signal.SIGTERM)
        await asyncio.to_thread(receiver.wait, 30)
    kept = json.loads((folder / "arrivals.json").read_text())
    return summarise(kept, json.loads((folder / "trace.json").read_text()), args)


def summarise(
    receiver: dict[str, Any], trace: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    arrivals: dict[str, list[float]] = receiver["arrivals"]  # id → [arrived, committed]
    leased: dict[str, list[float]] = trace["leased"]  # id → [leased at, lease size]
    started: dict[str, float] = trace["started"]
    first = min(committed for _, committed in arrivals.values())
    parts: dict[str, list[float]] = {"commit_to_arrival": [], "commit_to_lease": []}
    parts |= {"lease_to_request": [], "request_to_arrival": []}
    sizes = []
    for webhook_id, (arrived, committed) in arrivals.items():
        if committed - first < args.warm_up or webhook_id not in leased:
            continue
        at, size = leased[webhook_id]
        parts["commit_to_arrival"].append(arrived - committed)
        parts["commit_to_lease"].append(at - committed)
        parts["lease_to_request"].append(started[webhook_id] - at)
        parts["request_to_arrival"].append(arrived - started[webhook_id])
        sizes.append(size)
    return {
        "messages": len(parts["commit_to_arrival"]),
        "arrived": len(arrivals),
        "max_in_flight": receiver["max_in_flight"],
        "lease_size": figures(sizes, scale=1),
        **{name: figures(values) for name, values in parts.items()},
    }


def figures(values: list[float], scale: float = 1000) -> dict[str, float]:
    """p50 / p95 / p99 / max of ``values`` (milliseconds, unless ``scale`` says otherwise)."""
    if not values:
        return {}
    return {f"p{q}": round(percentile(values, q) * scale, 1) for q in (50, 95, 99)} | {
        "max": round(max(values) * scale, 1)
    }


def traced_relay(trace: Path) -> None:
    """``outbox serve``, with each lease and each request's start noted (``--traced-relay``)."""
    from outbox.hosting import cli  # the relay process alone
    from outbox.store.postgres import PostgresStore
    from outbox.transport.publisher import Publisher

    leased: dict[str, tuple[float, int]] = {}
    started: dict[str, float] = {}
    lease, deliver = PostgresStore.lease_batch, Publisher.deliver

    async def lease_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await lease(self, *args, **kwargs)
        now, size = time.time(), len(result.messages)
        for message in result.messages:
            leased.setdefault(str(message.message_id), (now, size))
        return result

    async def delivered(self: Any, message: Any, endpoint: Any) -> Any:
        started.setdefault(str(message.message_id), time.time())
        return await deliver(self, message, endpoint)

    PostgresStore.lease_batch = lease_batch  # type: ignore[method-assign]
    Publisher.deliver = delivered  # type: ignore[method-assign]
    try:
        cli.main(["serve", "--port", os.environ["OUTBOX_PORT"]])
    finally:
        trace.write_text(json.dumps({"leased": leased, "started": started}))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_to_request")
    add = parser.add_argument
    add("--rate", type=float, default=200.0, help="messages committed per second")
    add("--seconds", type=float, default=20.0, help="how long the producer commits")
    add("--warm-up", type=float, default=3.0, help="seconds of commits left out of the figures")
    add("--delay-ms", type=int, default=200, help="the receiver's answer time")
    add("--max-concurrency", type=int, default=32, help="the endpoint's (0: none)")
    add("--concurrency", type=int, default=0, help="OUTBOX_CONCURRENCY (0: the default)")
    add("--rounds", type=int, default=3)
    add("--traced-relay", type=Path, help=argparse.SUPPRESS)
    add("--receiver", type=int, help=argparse.SUPPRESS)  # the receiver's process, on this port
    add("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.traced_relay:
        traced_relay(args.traced_relay)
        return
    if args.receiver:
        asyncio.run(Receiver(args.delay_ms / 1000).serve(args.receiver, args.out))
        return
    bench_server()  # before an event loop runs
    for round_ in range(1, args.rounds + 1):
        result = asyncio.run(run_round(args))
        log(f"commit → request round {round_}: {json.dumps(result)}")


if __name__ == "__main__":
    main()
