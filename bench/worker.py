"""One contender's drain, in a process of its own (started by the benchmark driver).

    python -m bench.worker {raw,relay,pgqueuer,seed,hints} --database-url … --url … [options]

Prints one JSON object on stdout: the contender's own view of the run (``wall_seconds`` where it
has one, ``peak_rss_mb`` of this process, and details), so every contender starts from a fresh
interpreter and its memory is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any

import aiohttp
from opentelemetry.trace import INVALID_SPAN, Span

from bench.common import EVENT_TYPE, SECRET, body, relay_settings
from outbox import store
from outbox.azure.telemetry_setup import configure
from outbox.core.models import LeasedMessage
from outbox.core.outcomes import classify
from outbox.core.settings import decode_secret
from outbox.core.signing import Signer
from outbox.core.telemetry import Telemetry
from outbox.hosting.cli import run_on_loop
from outbox.relay.runtime import Relay, tune_garbage_collector
from outbox.store.connection import create_pool
from outbox.store.postgres import PostgresStore
from outbox.transport.publisher import Publisher, build_body, build_headers, make_session

# The seed design's per-row outcome write (one statement per message).
SEED_RECORD = """
UPDATE outbox_messages
SET status = $3,
    next_attempt_at = CASE WHEN $3 = 'Pending' THEN now() + make_interval(secs => $4)
                           ELSE next_attempt_at END,
    processed_at = CASE WHEN $3 = 'Processed' THEN now() END,
    lease_expires_at = NULL,
    last_error = $5
WHERE outbox_message_id = $1 AND lease_token = $2
"""
PGQ_ENTRYPOINT = "webhook"


def peak_rss_mb() -> float:
    """This process's own peak RSS: ``VmHWM``, its memory's high-water mark since its exec.
    (``ru_maxrss`` can carry the parent's peak across fork and exec: the benchmark's own.)"""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def plain_session(concurrency: int) -> aiohttp.ClientSession:
    """A keep-alive session with ``concurrency`` connections, as the relay's own."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=concurrency, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=10),
    )


async def post(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], data: bytes
) -> None:
    async with session.post(url, data=data, headers=headers) as response:
        await response.read()
        if response.status >= 300:
            raise RuntimeError(f"receiver answered {response.status}")


async def run_raw(args: argparse.Namespace) -> dict[str, Any]:
    """The ceiling: the relay's own requests, built before the clock starts, and no database.

    Each request is what the relay sends for that message (body, signed Standard Webhooks
    headers) on a session made like the relay's, POSTed by ``concurrency`` loops; all a relay
    adds on top is reading the rows and writing the outcomes.
    """
    setup_started = sum(cpu_seconds())
    signer = Signer([decode_secret(SECRET)])
    bodies = map(body, range(args.messages))
    requests: Iterator[tuple[bytes, dict[str, str]]] = iter(
        [(data, build_headers(signer, webhook_id, data)) for webhook_id, data in bodies]
    )
    # Building the requests happens before the clock: its CPU is not the ceiling's either.
    setup_cpu = sum(cpu_seconds()) - setup_started
    if args.build_only:  # only what is taken off the count (bench.instructions)
        return {"wall_seconds": 0.0, "setup_cpu_seconds": setup_cpu}

    async def loop(session: aiohttp.ClientSession) -> None:
        for data, headers in requests:
            async with session.post(args.url, data=data, headers=headers) as response:
                await response.read()
                if response.status >= 300:
                    raise RuntimeError(f"receiver answered {response.status}")

    settings = relay_settings("postgresql://unused", args.url, args.concurrency)
    async with make_session(settings) as session:
        started = time.monotonic()
        await asyncio.gather(*(loop(session) for _ in range(args.concurrency)))
        wall = time.monotonic() - started
    return {"wall_seconds": wall, "setup_cpu_seconds": setup_cpu}


async def run_relay(args: argparse.Namespace, telemetry: Telemetry | None = None) -> dict[str, Any]:
    """The relay as the triggers run it: ``Relay.open(settings)``, ``processor.execute()``.

    ``--endpoints N``: N endpoints for the event type (``<url>/e1`` … ``<url>/eN``), for the
    fan-out run. ``--shared``: one of several relays racing over the backlog, so it delivers
    a part of it. ``--lease-times``: report how long each lease statement took.
    """
    webhooks: dict[str, Any] | None = None
    if args.event_types > 1:
        webhooks = {
            f"T{t}": [
                {"name": f"e{n}", "url": f"{args.url}/t{t}/e{n}", "secret": SECRET}
                for n in range(1, args.endpoints + 1)
            ]
            for t in range(args.event_types)
        }
    elif args.endpoints > 1:
        group = [
            {"name": f"e{n}", "url": f"{args.url}/e{n}", "secret": SECRET}
            for n in range(1, args.endpoints + 1)
        ]
        webhooks = {EVENT_TYPE: group}
    overrides = {"webhooks": webhooks} if webhooks else {}
    settings = relay_settings(args.database_url, args.url, args.concurrency, **overrides)
    leases: list[float] = []
    leased_at: list[float] = []
    if args.lease_times:
        time_leases(leases, leased_at)
    # As the Functions worker and ``outbox serve`` do for their process's relay; the
    # interpreter's own thresholds with OUTBOX_BENCH_DEFAULT_GC=1 (to compare the two).
    if not os.environ.get("OUTBOX_BENCH_DEFAULT_GC"):
        tune_garbage_collector()
    if telemetry is None:
        configure()  # as the hosts do before they open a relay (bench.exporter's OTLP runs)
    async with await Relay.open(settings, telemetry=telemetry) as relay:
        started = time.monotonic()
        summary = await relay.processor.execute()
        wall = time.monotonic() - started
    if args.flush:
        flush_sdk()
    complete = args.shared or summary.processed == args.messages
    if summary.error or not complete:
        raise RuntimeError(f"relay drain incomplete: {summary.as_dict()}")
    result: dict[str, Any] = {"wall_seconds": wall, "summary": summary.as_dict()}
    if args.lease_times:
        result["lease_seconds"] = leases
        result["lease_started_seconds"] = [round(t - started, 4) for t in leased_at]
    return result


def flush_sdk() -> None:
    """Export what the SDK still holds (spans queued, metrics since the last export) and shut
    it down: the export's CPU is then the run's, not left to the interpreter's exit."""
    from opentelemetry import metrics, trace

    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def time_leases(durations: list[float], starts: list[float] | None = None) -> None:
    """Record the duration of every lease statement this process runs into ``durations``, and
    when each began (``time.monotonic()``) into ``starts``."""
    lease_batch = PostgresStore.lease_batch

    async def timed(*args: Any, **kwargs: Any) -> store.Lease:
        started = time.perf_counter()
        if starts is not None:
            starts.append(time.monotonic())
        try:
            return await lease_batch(*args, **kwargs)
        finally:
            durations.append(time.perf_counter() - started)

    # Patched on the store's class, every lease is timed.
    PostgresStore.lease_batch = timed  # type: ignore[method-assign]


class Untraced(Telemetry):
    """No spans and no metrics at all: the baseline for what the telemetry costs with no SDK."""

    @contextlib.contextmanager
    def run(self, trigger: str) -> Iterator[Span]:
        yield INVALID_SPAN

    @contextlib.contextmanager
    def delivery(self, **attributes: Any) -> Iterator[Span]:
        yield INVALID_SPAN

    def delivered(self, span: Span, result: Any, **fields: Any) -> None:
        pass

    def ran(self, span: Span, summary: Any) -> None:
        pass


async def run_untraced(args: argparse.Namespace) -> dict[str, Any]:
    """The relay with its telemetry calls taken out (``relay`` runs them as the API's no-ops)."""
    return await run_relay(args, telemetry=Untraced())


async def run_seed(args: argparse.Namespace) -> dict[str, Any]:
    """The seed's loop: lease 100, POST each in turn, UPDATE each row on its own."""
    import asyncpg

    settings = relay_settings(args.database_url, args.url, args.concurrency)
    conn = await asyncpg.connect(args.database_url)
    publisher = Publisher.from_settings(settings)
    [endpoint] = settings.endpoints[EVENT_TYPE]
    delivered = 0
    try:
        started = time.monotonic()
        while batch := (
            await PostgresStore(conn).lease_batch(100, settings.lease_seconds)
        ).messages:
            for message in batch:
                outcome = classify(
                    await publisher.deliver(message, endpoint),
                    attempt=message.attempt,
                    max_attempts=settings.max_attempts,
                    now=datetime.now(UTC),
                )
                await conn.execute(
                    SEED_RECORD,
                    message.message_id,
                    message.lease_token,
                    str(outcome.status),
                    outcome.delay_seconds,
                    outcome.error,
                )
                delivered += 1
        wall = time.monotonic() - started
    finally:
        await publisher.close()
        await conn.close()
    return {"wall_seconds": wall, "delivered": delivered}


async def run_floor(args: argparse.Namespace) -> dict[str, Any]:
    """What any relay of this design must do per message, and nothing more, with the relay's
    concurrency model: the next batch leased while the one before is still being sent,
    ``concurrency`` loops taking one message after another across batches (none waits for a
    batch's slowest request), and each batch's outcomes recorded in one statement as soon as its
    last request is answered. No dispatch, admission, breakers, fencing checks, logs or
    telemetry: a lower bound under the relay process's own CPU and time."""
    settings = relay_settings(args.database_url, args.url, args.concurrency)
    pool = await create_pool(settings)
    relay_store = PostgresStore(pool)
    signer = Signer([decode_secret(SECRET)])
    [endpoint] = settings.endpoints[EVENT_TYPE]
    name = endpoint.name or EVENT_TYPE
    # A batch's messages and the attempts sent so far; at most a batch waits unsent.
    Item = tuple[list[LeasedMessage], list[store.SentAttempt], LeasedMessage]
    waiting: asyncio.Queue[Item | None] = asyncio.Queue(maxsize=args.batch_size)
    recording: list[asyncio.Task[Any]] = []
    delivered = 0
    async with make_session(settings) as session:

        async def post(message: LeasedMessage) -> store.SentAttempt:
            assert message.payload is not None
            data = build_body(message, message.payload)
            headers = build_headers(signer, str(message.message_id), data)
            started, clock = time.time(), time.monotonic()
            async with session.post(args.url, data=data, headers=headers) as response:
                await response.read()
            took = round((time.monotonic() - clock) * 1000)
            return store.SentAttempt(
                message.message_id, name, message.attempt, started, took, response.status
            )

        async def record(batch: list[LeasedMessage], sent: list[store.SentAttempt]) -> None:
            order = {m.message_id: i for i, m in enumerate(batch)}
            sent.sort(key=lambda a: order[a.outbox_message_id])
            await relay_store.record_delivered(batch, sent)

        async def sender() -> None:
            while (item := await waiting.get()) is not None:
                batch, sent, message = item
                sent.append(await post(message))
                if len(sent) == len(batch):
                    recording.append(asyncio.create_task(record(batch, sent)))

        async def leaser() -> int:
            leased = 0
            while batch := (
                await relay_store.lease_batch(args.batch_size, settings.lease_seconds)
            ).messages:
                sent: list[store.SentAttempt] = []
                for message in batch:
                    await waiting.put((batch, sent, message))
                leased += len(batch)
            for _ in range(args.concurrency):
                await waiting.put(None)
            return leased

        try:
            started = time.monotonic()
            # A sender's error ends the run at once (the leaser would otherwise wait for it).
            delivered, *_ = await asyncio.gather(
                leaser(), *(sender() for _ in range(args.concurrency))
            )
            await asyncio.gather(*recording)
            wall = time.monotonic() - started
        finally:
            await pool.close()
    return {"wall_seconds": wall, "delivered": delivered}


async def run_pgqueuer(args: argparse.Namespace) -> dict[str, Any]:
    """One pgqueuer QueueManager in drain mode; its entrypoint POSTs the job's payload, signed
    as the relay signs a webhook (Standard Webhooks headers, the job's id as ``webhook-id``)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn = await asyncpg.connect(args.database_url)
    session = plain_session(args.concurrency)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    signer = Signer([decode_secret(SECRET)])
    failures: list[str] = []

    @qm.entrypoint(PGQ_ENTRYPOINT, concurrency_limit=args.pgq_entrypoint_limit)
    async def webhook(job: Job) -> None:
        assert job.payload is not None
        try:
            headers = build_headers(signer, str(job.id), job.payload)
            await post(session, args.url, headers, job.payload)
        except Exception as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
            raise

    try:
        started = time.monotonic()
        await qm.run(
            batch_size=args.batch_size,
            mode=QueueExecutionMode.drain,
            max_concurrent_tasks=args.pgq_max_tasks or None,
        )
        wall = time.monotonic() - started
    finally:
        await session.close()
        await conn.close()
    if failures:
        raise RuntimeError(f"{len(failures)} pgqueuer jobs failed, first: {failures[0]}")
    return {"wall_seconds": wall}


async def run_hints(args: argparse.Namespace) -> dict[str, Any]:
    """A stand-in for the Functions host's queue trigger: one drain per wake-up hint.

    Receives hints from the Azurite queue one at a time (``batchSize: 1`` in host.json), hands
    each to ``outbox.triggers.on_hint`` and deletes it; an empty queue is polled again after
    0.1 s, backing off to ``maxPollingInterval`` (1 s, as in host.json). Runs until SIGTERM.
    """
    from azure.core.exceptions import AzureError, ResourceExistsError

    from outbox.azure import triggers
    from outbox.azure.host import functions_host
    from outbox.core.settings import QueueSettings
    from outbox.transport.wakeup import make_queue_client

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    # The queue from the environment, base64-decoded: what the host's queue trigger reads.
    client = make_queue_client(QueueSettings.load())
    drains, delay = 0, 0.1
    async with client:
        with contextlib.suppress(ResourceExistsError):
            await client.create_queue()
        # A warm worker, as the host keeps one: the first drain opens the pool and the session.
        await triggers.drain("warm-up")
        print("ready", flush=True)
        while not stop.is_set():
            try:
                message = await client.receive_message(visibility_timeout=30)
            except AzureError as exc:
                # As the host does: a storage hiccup is logged and polling goes on.
                print(f"receiving a hint failed: {type(exc).__name__}", file=sys.stderr)
                message = None
            if message is None:
                await _wait(stop, delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.1
            await triggers.on_hint(
                message.content.encode(), message_id=message.id, dequeue_count=message.dequeue_count
            )
            drains += 1
            with contextlib.suppress(AzureError):  # not deleted: it comes back, one more drain
                await client.delete_message(message)
    await functions_host.close()
    return {"drains": drains}


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


RUNNERS: dict[str, Callable[[argparse.Namespace], Awaitable[dict[str, Any]]]] = {
    "raw": run_raw,
    "relay": run_relay,
    "pgqueuer": run_pgqueuer,
    "seed": run_seed,
    "floor": run_floor,
    "untraced": run_untraced,
    "hints": run_hints,
}


def profiler(path: str | None) -> AbstractContextManager[Any]:
    """pyinstrument around the run when ``--profile FILE.html`` is given."""
    if not path:
        return nullcontext()
    from pyinstrument import Profiler

    class _Profile(AbstractContextManager[Any]):
        def __enter__(self) -> Any:
            self.profiler = Profiler(async_mode="enabled")
            self.profiler.start()
            return self.profiler

        def __exit__(self, *_: object) -> None:
            self.profiler.stop()
            with open(path, "w", encoding="utf-8") as out:
                out.write(self.profiler.output_html())
            with open(path + ".txt", "w", encoding="utf-8") as out:
                out.write(self.profiler.output_text(flat=True, time="percent_of_total"))

    return _Profile()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    parser.add_argument("contender", choices=sorted(RUNNERS))
    parser.add_argument("--database-url", default="")
    parser.add_argument("--url", default="", help="where to POST")
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--pgq-max-tasks", type=int, default=0)
    parser.add_argument("--pgq-entrypoint-limit", type=int, default=0)
    parser.add_argument("--profile", help="write a pyinstrument HTML profile here")
    parser.add_argument("--endpoints", type=int, default=1, help="relay: endpoints per type")
    parser.add_argument("--event-types", type=int, default=1, help="relay: T0 … T{N-1}")
    parser.add_argument("--shared", action="store_true", help="relay: one of several racing")
    parser.add_argument("--lease-times", action="store_true", help="relay: time each lease")
    parser.add_argument("--flush", action="store_true", help="relay: flush the SDK at the end")
    parser.add_argument("--build-only", action="store_true", help="raw: build requests, no POST")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (serve --uvloop)")
    args = parser.parse_args(argv)
    cpu_at_start = cpu_seconds()
    with profiler(args.profile):
        result = run_on_loop(lambda: RUNNERS[args.contender](args), uvloop=args.uvloop)
    user, system = (end - start for end, start in zip(cpu_seconds(), cpu_at_start, strict=True))
    result["cpu_seconds"] = round(user + system - result.pop("setup_cpu_seconds", 0.0), 2)
    result["cpu_user_seconds"] = round(user, 2)
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    json.dump(result, sys.stdout)
    print(flush=True)


if __name__ == "__main__":
    main()
