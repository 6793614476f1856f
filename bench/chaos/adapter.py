"""One replica of the relay under the chaos harness: ``python -m bench.chaos.adapter``.

``bench/chaos/harness.py`` registers this as the harness's system ``outbox``; the harness starts
one process per replica with its environment (``DATABASE_URL``, ``BENCH_INSTANCE_ID``,
``PRODUCER_RATE``, ``WORKER_COUNT``, ``SAMPLE_EVERY_S``, ``JOB_PAYLOAD_BYTES``, ``JOB_WORK_MS``,
``PRODUCER_PACING``, ``PRODUCER_RATE_CONTROL_FILE``), plus two from the wrapper:
``OUTBOX_CHAOS_RECEIVER``, the run's receiver (``bench.chaos.arrivals``), and ``OUTBOX_CHAOS_DIR``,
where its ledgers are. Each replica is two parts:

- a producer (``bench.chaos.producer``): ``outbox.transaction`` / ``enqueue`` on asyncpg, a NOTIFY
  after each commit (``OUTBOX_WAKEUP=postgres``);
- the relay (``bench.chaos.relay``): ``python -m outbox serve`` with ``OUTBOX_WAKEUP=postgres``,
  a child that dies with this process, posting signed ``ChaosEvent`` webhooks to
  ``<receiver>/chaos/<instance>``, which the receiver writes to this replica's ledger.

The harness protocol on stdout (JSON lines; logs go to stderr): the descriptor once the schema
is migrated, then every ``SAMPLE_EVERY_S`` (on the wall clock's multiples) ``claim_p50_ms``,
``claim_p95_ms``, ``claim_p99_ms`` (enqueue → webhook arrival, of what this replica's relay sent
over the last 30 s; not sent while nothing arrived), ``enqueue_rate`` (rows committed/s),
``completion_rate`` (webhooks its relay delivered/s) and ``relay_restarts_total``; instance 0
adds ``queue_depth`` (Pending and Processing rows) and, over every replica's ledger,
``delivered_unique_total`` and ``duplicate_deliveries_total``.

Nothing but a signal ends it. On SIGTERM it stops producing, waits up to
``OUTBOX_CHAOS_DRAIN_SECONDS`` (60) until no row is Pending or Processing, stops its relay, and
instance 0 writes the exact count (``bench.chaos.tally``) to ``tally.json`` and prints it as a
final line (``"kind": "final"``) on stdout and stderr. The harness stops reading stdout when it
signals, so ``harness.py`` reads ``tally.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg

from bench.chaos import arrivals, tally
from bench.chaos.producer import EVENT_TYPE, Owed, Producer, RateControl, pace, read_stdin
from bench.chaos.relay import Relay
from bench.common import ROOT, SECRET, percentile
from outbox.store.migrate import discover

logger = logging.getLogger("bench.chaos.adapter")
T = TypeVar("T")

MANIFEST = Path(__file__).with_name("adapter.json")
PENDING = "SELECT count(*) FROM outbox_messages WHERE status IN ('Pending', 'Processing')"
QUERY_TIMEOUT_SECONDS = 2.0
PRODUCER_STOP_SECONDS = 5.0
RELAY_STOP_SECONDS = 15.0
TALLY_SECONDS = 15.0


@dataclass(frozen=True)
class Config:
    """The harness's environment, read once."""

    database_url: str
    instance: int
    sample_every: float
    base_rate: float
    harness_pacing: bool
    control_file: Path | None
    workers: int
    payload_bytes: int
    receiver: str
    ledgers: Path
    drain_seconds: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        if env.get("PRODUCER_MODE", "fixed") != "fixed":
            raise SystemExit("outbox adapter: only PRODUCER_MODE=fixed is supported")
        if not (env.get("OUTBOX_CHAOS_DIR") and env.get("OUTBOX_CHAOS_RECEIVER")):
            raise SystemExit("outbox adapter: OUTBOX_CHAOS_DIR/_RECEIVER not set (harness.py sets)")
        control = env.get("PRODUCER_RATE_CONTROL_FILE")
        return cls(
            database_url=env["DATABASE_URL"],
            instance=int(env.get("BENCH_INSTANCE_ID", "0")),
            sample_every=float(env.get("SAMPLE_EVERY_S", "5")),
            base_rate=float(env.get("PRODUCER_RATE", "800")),
            harness_pacing=env.get("PRODUCER_PACING", "harness") == "harness",
            control_file=Path(control) if control else None,
            workers=int(env.get("WORKER_COUNT", "32")),
            payload_bytes=int(env.get("JOB_PAYLOAD_BYTES", "256")),
            receiver=env["OUTBOX_CHAOS_RECEIVER"],
            ledgers=Path(env["OUTBOX_CHAOS_DIR"]),
            drain_seconds=float(env.get("OUTBOX_CHAOS_DRAIN_SECONDS", "60")),
        )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Telemetry:
    """The JSON lines the harness reads from stdout."""

    def __init__(self, instance: int) -> None:
        self.instance = instance

    def line(self, record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    def metric(self, metric: str, value: float, window: float) -> None:
        self.line(
            {
                "t": now_iso(),
                "system": "outbox",
                "kind": "adapter",
                "subject_kind": "adapter",
                "subject": "",
                "metric": metric,
                "value": value,
                "window_s": round(window, 3),
                "instance_id": self.instance,
            }
        )

    def descriptor(self, database_url: str) -> None:
        manifest = json.loads(MANIFEST.read_text())
        self.line(
            {
                "kind": "descriptor",
                "system": manifest["system"],
                "event_tables": manifest["event_tables"],
                "extensions": manifest["extensions"],
                "version": version(),
                "schema_version": discover()[-1].name,
                "db_name": urlsplit(database_url).path.lstrip("/"),
                "started_at": now_iso(),
                "instance_id": self.instance,
            }
        )


def version() -> str:
    """The package's version and the checkout's commit."""
    release = importlib.metadata.version("outbox-relay")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{release}+{commit}" if commit else release


class Database:
    """A connection of the adapter's own (depth, drain, count), made again after any failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: asyncpg.Connection | None = None

    async def attempt(
        self, work: Callable[[asyncpg.Connection], Awaitable[T]], seconds: float
    ) -> T | None:
        """``work``'s result within ``seconds``, or None when the database failed it (logged)."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.url, timeout=seconds)
            return await asyncio.wait_for(work(self._conn), seconds)
        except Exception as exc:  # noqa: BLE001 - down, restarting, backend killed: try later
            logger.info("database: %s: %s", type(exc).__name__, exc)
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.terminate()
            return None

    async def pending(self) -> int | None:
        return await self.attempt(lambda conn: conn.fetchval(PENDING), QUERY_TIMEOUT_SECONDS)

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()


async def migrate(config: Config) -> None:
    """``python -m outbox migrate`` until it succeeds (idempotent; safe from several replicas)."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": config.database_url}
    while True:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "outbox", "migrate", env=env, stdout=sys.stderr
        )
        if await process.wait() == 0:
            return
        await asyncio.sleep(1)


def relay_env(config: Config) -> dict[str, str]:
    hook = {"url": f"{config.receiver}/chaos/{config.instance}", "secret": SECRET}
    return {
        **os.environ,
        "OUTBOX_DATABASE_URL": config.database_url,
        "OUTBOX_WAKEUP": "postgres",
        "OUTBOX_WEBHOOKS": json.dumps({EVENT_TYPE: hook}),
        "OUTBOX_CONCURRENCY": str(config.workers),
    }


class Sampler:
    """Every ``SAMPLE_EVERY_S``: the harness's metrics over the interval just ended."""

    def __init__(
        self,
        config: Config,
        telemetry: Telemetry,
        parts: tuple[arrivals.Arrivals, Producer, Relay],
        database: Database,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        self.arrivals, self.producer, self.relay = parts
        self.database = database
        self.fleet = arrivals.Fleet(config.ledgers) if config.instance == 0 else None
        self._at = time.monotonic()
        self._received = self.arrivals.received
        self._committed = self.producer.committed

    async def run(self) -> None:
        every = self.config.sample_every
        while True:
            await asyncio.sleep(every - time.time() % every)
            try:
                await self.sample()
            except Exception:  # a failed sample must not end the sampling
                logger.exception("sample failed")

    async def sample(self) -> None:
        now = time.monotonic()
        interval, self._at = now - self._at, now
        emit = self.telemetry.metric
        self.arrivals.poll()
        latencies = self.arrivals.recent_latencies()
        if latencies:
            for q in (50, 95, 99):
                emit(f"claim_p{q}_ms", percentile(latencies, q), arrivals.LATENCY_WINDOW_SECONDS)
        received, committed = self.arrivals.received, self.producer.committed
        emit("enqueue_rate", (committed - self._committed) / interval, interval)
        emit("completion_rate", (received - self._received) / interval, interval)
        self._received, self._committed = received, committed
        emit("relay_restarts_total", self.relay.restarts, interval)
        if self.fleet is not None:
            await self.observe(interval)

    async def observe(self, interval: float) -> None:
        """Instance 0's metrics of the whole fleet."""
        assert self.fleet is not None
        self.fleet.poll()
        self.telemetry.metric("delivered_unique_total", self.fleet.unique, interval)
        self.telemetry.metric("duplicate_deliveries_total", self.fleet.repeats, interval)
        depth = await self.database.pending()
        if depth is not None:
            self.telemetry.metric("queue_depth", depth, 0)


async def drain(database: Database, seconds: float) -> float | None:
    """Seconds until no row is Pending or Processing, or None if that took over ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if await database.pending() == 0:
            return round(time.monotonic() - start, 3)
        await asyncio.sleep(0.5)
    return None


async def count(config: Config, database: Database, drained: float | None) -> dict[str, Any]:
    """The exact count (instance 0), retried while the database fails it."""
    deadline = time.monotonic() + TALLY_SECONDS
    while time.monotonic() < deadline:
        result = await database.attempt(lambda conn: tally.tally(conn, config.ledgers), 10)
        if result is not None:
            return {"drained_in_s": drained, "drain_limit_s": config.drain_seconds, **result}
        await asyncio.sleep(1)
    return {"error": "the database did not answer the final count"}


def report_final(config: Config, telemetry: Telemetry, result: dict[str, Any]) -> None:
    (config.ledgers / "tally.json").write_text(json.dumps(result, indent=1) + "\n")
    listed = ("lost_messages", "duplicates")
    final = {"kind": "final", "system": "outbox", "t": now_iso(), "instance_id": 0}
    final |= {key: value for key, value in result.items() if key not in listed}
    telemetry.line(final)
    print(json.dumps(final), file=sys.stderr, flush=True)


class Replica:
    """This replica's parts, started in order and stopped in order."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.telemetry = Telemetry(config.instance)
        self.owed = Owed()
        self.control = RateControl(config.base_rate, config.control_file)
        self.producer = Producer(config.database_url, config.payload_bytes)
        self.database = Database(config.database_url)
        self.arrivals = arrivals.Arrivals(config.ledgers, config.instance)
        self.relay: Relay | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.producing: asyncio.Task[None] | None = None
        self.sampling: asyncio.Task[None] | None = None

    def feed(self) -> None:
        """Start taking the harness's requests for rows, before anything else: its pacer
        writes to stdin from the moment this process exists."""
        pacing = read_stdin if self.config.harness_pacing else pace
        self.spawn(pacing(self.owed, self.control))

    async def start(self) -> None:
        """Schema, relay (until ready), then production, sampling and the descriptor."""
        await migrate(self.config)
        log_path = self.config.ledgers / f"relay-{self.config.instance}-{os.getpid()}.log"
        self.relay = Relay(relay_env(self.config), log_path)
        self.spawn(self.relay.supervise())
        await self.relay.ready()
        parts = (self.arrivals, self.producer, self.relay)
        self.sampling = self.spawn(Sampler(self.config, self.telemetry, parts, self.database).run())
        self.producing = self.spawn(self.producer.run(self.owed))
        self.telemetry.descriptor(self.config.database_url)

    def spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(job)
        self.tasks.append(task)
        return task

    async def stop(self) -> None:
        """Stop producing, let the relays deliver what was committed, stop the relay; instance
        0 then counts."""
        config = self.config
        logger.info("stopping: producer, drain (at most %s s), relay", config.drain_seconds)
        if self.sampling is not None:  # the harness no longer reads stdout: it would fill
            self.sampling.cancel()
        self.producer.stopping = True
        if self.producing is not None:
            await asyncio.wait({self.producing}, timeout=PRODUCER_STOP_SECONDS)
        drained = await drain(self.database, config.drain_seconds)
        if self.relay is not None:
            await self.relay.stop(RELAY_STOP_SECONDS)
        if config.instance == 0:
            report_final(config, self.telemetry, await count(config, self.database, drained))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.relay is not None:
            await self.relay.stop(RELAY_STOP_SECONDS)
        await asyncio.gather(self.producer.close(), self.database.close())


async def run(config: Config) -> None:
    """Until SIGTERM or SIGINT; a signal during start-up stops at once."""
    stop = asyncio.create_task(stop_signals().wait())
    replica = Replica(config)
    replica.feed()
    starting = asyncio.create_task(replica.start())
    await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
    elif starting.exception() is not None:
        logger.error("start-up failed", exc_info=starting.exception())
    else:
        await stop
        await replica.stop()
    await replica.close()


def stop_signals() -> asyncio.Event:
    """An event set at SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


def main() -> None:
    config = Config.from_env(os.environ)
    config.ledgers.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s outbox[{config.instance}] %(levelname)s %(name)s: %(message)s",
    )
    os.environ["OUTBOX_WAKEUP"] = "postgres"  # the producer's hint: a NOTIFY after each commit
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(config))


if __name__ == "__main__":
    main()
