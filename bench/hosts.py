"""The latency section's contenders: four ways from a producer's commit to the receiver.

- ``serve_postgres``: ``python -m outbox serve`` with ``OUTBOX_WAKEUP=postgres``; the producers'
  NOTIFY (after each commit) wakes a drain (``outbox.hosting.drainer``).
- ``serve_queue``: ``python -m outbox serve`` with the wake-up queue on Azurite; each commit's
  hint is received by serve's own queue listener (``serve.QueueListener``: one message at a
  time, polling again at once after one and backing off to host.json's ``maxPollingInterval``,
  1 s, while the queue is empty), which calls the ``outbox_queue`` function.
- ``functions``: the Functions app as Flex Consumption builds it (``tests.support.deployment``:
  ``requirements.txt`` alone, Python 3.13) under Microsoft's worker runtime
  (``azure-functions-runtime``), with the app settings a Flex site has (``WEBSITE_SKU``: so the
  relay takes Flex's default of 512 requests in flight). ``HostPoller`` stands in for the
  Functions host's queue listener: the loop of the WebJobs SDK's ``QueueListener`` with
  host.json's settings (``batchSize`` 1 and ``newBatchThreshold`` 0: one invocation at a time;
  after a message the queue is read again at once, after an empty read the SDK's
  ``RandomizedExponentialBackoffStrategy`` from 100 ms to ``maxPollingInterval``), each hint
  base64-decoded and handed to ``outbox_queue`` through the worker protocol, deleted once the
  invocation succeeded. What it does not stand in for: the host's own process and its gRPC
  channel to the worker (the JSON lines of ``functions_worker/host.py`` instead), the Scale
  Controller (Flex would add instances as the hint queue grows: here one instance serves every
  hint), cold starts (the worker is started and warmed before the clock) and the queue
  service's network (Azurite on this machine).
- ``pgqueuer``: ``bench.pgq_listen``, pgqueuer's ``QueueManager`` in continuous mode, woken by
  the NOTIFY its trigger sends at each enqueue's commit.

Each is an async context manager over a fresh database; ``cpu_seconds()`` is the CPU its
process (or the worker's) has used so far, and ``after_rate()`` reports what is left in the
wake-up queue and clears it, so that a rate does not inherit the hints of the one before.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from azure.core.exceptions import AzureError
from azure.storage.queue.aio import QueueClient

from bench.common import EVENT_TYPE, ROOT, SECRET, median
from tests.support.azure import free_port
from tests.support.azurite import Azurite

QUEUE_NAME = "outbox-wakeup"
CONTENDERS = ("serve_postgres", "serve_queue", "functions", "pgqueuer")
# The producer each contender's messages come from (bench.offered).
PRODUCER = {name: "pgqueuer" if name == "pgqueuer" else "outbox" for name in CONTENDERS}
# Whose producers send each commit's hint to the wake-up queue (and wait for its answer).
QUEUE_HINTED = frozenset({"serve_queue", "functions"})
# The WebJobs SDK's queue listener: QueuePollingIntervals.Minimum, and its backoff's
# randomisation (RandomizedExponentialBackoffStrategy.RandomizationFactor).
POLL_MINIMUM_SECONDS = 0.1
POLL_RANDOMISATION = 0.2
# host.json: maxPollingInterval, visibilityTimeout (a failed invocation's message comes back
# after it); the SDK leases a received message for 10 minutes, renewing it while it runs.
MAX_POLLING_SECONDS = 1.0
RETRY_VISIBILITY_SECONDS = 30
RECEIVE_VISIBILITY_SECONDS = 600
START_TIMEOUT_SECONDS = 60.0


def webhooks(hook_url: str) -> str:
    return json.dumps({EVENT_TYPE: {"url": hook_url, "secret": SECRET}})


def clean_environment() -> dict[str, str]:
    """This process's environment without any relay or storage setting of its own."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OUTBOX_", "AzureWebJobs", "WEBSITE_"))
    }


def process_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class Contender:
    """What the latency section needs of each contender."""

    name = ""
    # The producer's environment: how its hints go (OUTBOX_WAKEUP, the queue), if any.
    producer_env: dict[str, str]
    azurite: Azurite | None = None

    async def __aenter__(self) -> Contender:
        raise NotImplementedError

    async def __aexit__(self, *exc: object) -> None:
        raise NotImplementedError

    def cpu_seconds(self) -> float:
        raise NotImplementedError

    async def sweep(self) -> None:
        """What the five-minute timer does for messages whose hint was lost: one drain."""
        raise NotImplementedError

    def queue_service_cpu(self) -> float | None:
        """The CPU Azurite has used so far, for the contenders woken through it."""
        if self.azurite is None or self.azurite.process is None:
            return None
        return process_cpu(self.azurite.process.pid)

    async def after_rate(self) -> dict[str, Any]:
        """Hints left in the wake-up queue once every message arrived (then cleared)."""
        if self.azurite is None:
            return {}
        client = raw_queue(self.azurite)
        async with client:
            left = (await client.get_queue_properties()).approximate_message_count or 0
            await client.clear_messages()
        return {"hints_left": int(left)}


def raw_queue(azurite: Azurite) -> QueueClient:
    """The wake-up queue, its messages as stored (base64, as host.json's messageEncoding)."""
    return QueueClient.from_connection_string(azurite.connection_string, QUEUE_NAME)


async def create_queue(azurite: Azurite) -> None:
    async with raw_queue(azurite) as client:
        with contextlib.suppress(Exception):
            await client.create_queue()


class ServeProcess(Contender):
    """``python -m outbox serve`` woken over PostgreSQL (``wakeup="postgres"``) or by the queue."""

    def __init__(self, database_url: str, hook_url: str, wakeup: str) -> None:
        self.name = f"serve_{wakeup}"
        self.port = free_port()
        self.settings = {
            "OUTBOX_DATABASE_URL": database_url,
            "OUTBOX_WEBHOOKS": webhooks(hook_url),
        }
        if wakeup == "postgres":
            self.settings["OUTBOX_WAKEUP"] = "postgres"
        else:
            self.azurite = Azurite()
        self.producer_env: dict[str, str] = {}
        self.log = tempfile.NamedTemporaryFile(prefix="bench-serve-", suffix=".log")  # noqa: SIM115
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> ServeProcess:
        if self.azurite is not None:
            self.azurite.start()
            await create_queue(self.azurite)
            queue = {
                "AzureWebJobsStorage": self.azurite.connection_string,
                "OUTBOX_QUEUE_NAME": QUEUE_NAME,
            }
            self.settings.update(queue)
            self.producer_env = queue
        else:
            self.producer_env = {"OUTBOX_WAKEUP": "postgres"}
        self.process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "outbox", "serve", "--port", str(self.port)),
            cwd=ROOT,  # host.json: the repository's
            env={**clean_environment(), **self.settings},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        await self._wait_until_healthy()
        return self

    async def _wait_until_healthy(self) -> None:
        url = f"http://127.0.0.1:{self.port}/healthz"
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_SECONDS
        async with aiohttp.ClientSession() as session:
            while asyncio.get_running_loop().time() < deadline:
                assert self.process is not None
                if self.process.returncode is not None:
                    break
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}")

    async def sweep(self) -> None:
        """serve's own timer fires every five minutes: a drain of the same settings, now."""
        from outbox.core.settings import Settings
        from outbox.relay.runtime import Relay

        settings = Settings.load(
            database_url=self.settings["OUTBOX_DATABASE_URL"],
            webhooks=json.loads(self.settings["OUTBOX_WEBHOOKS"]),
        )
        async with await Relay.open(settings) as relay:
            await relay.processor.execute()

    def log_tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def cpu_seconds(self) -> float:
        assert self.process is not None
        return process_cpu(self.process.pid)

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.azurite is not None:
            self.azurite.stop()
        self.log.close()


class Backoff:
    """The WebJobs SDK's ``RandomizedExponentialBackoffStrategy`` (Microsoft.Azure.WebJobs.
    Extensions.Storage.Common.Timers), minimum and step 100 ms, maximum host.json's
    ``maxPollingInterval``: after a read that found a message the next empty read waits the
    minimum; each empty read after it the minimum plus a doubling step (randomised ±20 %),
    until the maximum."""

    def __init__(self, maximum: float = MAX_POLLING_SECONDS) -> None:
        self.maximum = maximum
        self.exponent = 0
        self.current = 0.0

    def next_delay(self, found: bool) -> float:
        if found:
            self.current, self.exponent = POLL_MINIMUM_SECONDS, 1
        elif self.current != self.maximum:
            step = POLL_MINIMUM_SECONDS
            if self.exponent > 0:
                spread = random.uniform(1 - POLL_RANDOMISATION, 1 + POLL_RANDOMISATION)
                step += spread * 2 ** (self.exponent - 1) * POLL_MINIMUM_SECONDS
            if step < self.maximum:
                self.current = step
                self.exponent += 1
            else:
                self.current = self.maximum
        return self.current


class HostPoller:
    """The Functions host's queue listener for ``outbox_queue`` (see the module's docstring)."""

    def __init__(self, worker: Any, azurite: Azurite) -> None:
        self.worker = worker
        self.client = raw_queue(azurite)
        self.invocations = 0
        self.failures = 0
        self.stopping = asyncio.Event()
        # Seconds each invocation took (sent to answered), and each receive and delete.
        self.invoking: list[float] = []
        self.queue_calls: list[float] = []

    async def run(self) -> None:
        backoff = Backoff()
        found_since_delay = False
        async with self.client:
            while not self.stopping.is_set():
                started = time.perf_counter()
                try:
                    messages = self.client.receive_messages(
                        max_messages=1, visibility_timeout=RECEIVE_VISIBILITY_SECONDS
                    )
                    message = await anext(aiter(messages), None)
                except AzureError:
                    message = None  # as the host: a storage error is a poll that found none
                self.queue_calls.append(time.perf_counter() - started)
                if message is not None:
                    found_since_delay = True
                    await self._invoke(message)
                    continue
                delay = backoff.next_delay(found_since_delay)
                found_since_delay = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), delay)

    async def _invoke(self, message: Any) -> None:
        body = base64.b64decode(message.content).decode()
        started = time.perf_counter()
        result = await self.worker.invoke_queue(
            "outbox_queue", body, dequeue_count=message.dequeue_count, message_id=message.id
        )
        self.invoking.append(time.perf_counter() - started)
        self.invocations += 1
        started = time.perf_counter()
        # A hint already gone (the queue cleared between two rates) is no failure of the app.
        with contextlib.suppress(AzureError):
            if result.status == "Success":
                await self.client.delete_message(message)
            else:
                self.failures += 1
                await self.client.update_message(
                    message, visibility_timeout=RETRY_VISIBILITY_SECONDS
                )
        self.queue_calls.append(time.perf_counter() - started)


class FunctionsApp(Contender):
    """The built app under Microsoft's worker runtime, its queue trigger driven by
    ``HostPoller``."""

    name = "functions"

    def __init__(self, deployed: Any, database_url: str, hook_url: str) -> None:
        self.deployed = deployed
        self.azurite = Azurite()
        self.database_url = database_url
        self.hook_url = hook_url
        self.producer_env: dict[str, str] = {}
        self.worker: Any = None
        self.poller: HostPoller | None = None
        self.polling: asyncio.Task[None] | None = None

    async def __aenter__(self) -> FunctionsApp:
        from tests.support.deployment import FunctionsWorker

        assert self.azurite is not None
        self.azurite.start()
        await create_queue(self.azurite)
        queue = {
            "AzureWebJobsStorage": self.azurite.connection_string,
            "OUTBOX_QUEUE_NAME": QUEUE_NAME,
        }
        self.producer_env = queue
        settings = {
            **queue,
            "OUTBOX_DATABASE_URL": self.database_url,
            "OUTBOX_WEBHOOKS": webhooks(self.hook_url),
            "WEBSITE_SKU": "FlexConsumption",
        }
        self.worker = FunctionsWorker(self.deployed, settings, invocation_timeout=600)
        await self.worker.__aenter__()
        # A warm instance, as the host keeps one: the first invocation opens the pool.
        warm = await self.worker.invoke_timer("outbox_timer")
        if warm.status != "Success":
            raise RuntimeError(f"the Functions app's first invocation failed: {warm.exception}")
        self.poller = HostPoller(self.worker, self.azurite)
        self.polling = asyncio.create_task(self.poller.run())
        return self

    async def sweep(self) -> None:
        """The app's own timer function, as the host fires it every five minutes."""
        result = await self.worker.invoke_timer("outbox_timer")
        if result.status != "Success":
            raise RuntimeError(f"the Functions app's sweep failed: {result.exception}")

    def cpu_seconds(self) -> float:
        process = self.worker._process  # the worker's own process
        return process_cpu(process.pid)

    async def after_rate(self) -> dict[str, Any]:
        """Besides the hints left: the invocations since the last rate, how long each took
        (median ms), and each call to the queue (a receive or a delete)."""
        found = await super().after_rate()
        poller = self.poller
        assert poller is not None
        assert self.polling is not None
        if self.polling.done():
            self.polling.result()  # the stand-in's own failure, raised here
            raise RuntimeError("the Functions host stand-in stopped polling")
        found.update(
            invocations=poller.invocations,
            failed=poller.failures,
            invocation_p50_ms=round(median(poller.invoking) * 1000, 1),
            queue_call_p50_ms=round(median(poller.queue_calls) * 1000, 1),
        )
        poller.invocations = poller.failures = 0
        poller.invoking, poller.queue_calls = [], []
        return found

    async def __aexit__(self, *exc: object) -> None:
        if self.poller is not None and self.polling is not None:
            self.poller.stopping.set()
            with contextlib.suppress(Exception):
                await self.polling
        if self.worker is not None:
            await self.worker.stop()
        assert self.azurite is not None
        self.azurite.stop()


class PgqueuerService(Contender):
    """``bench.pgq_listen``: pgqueuer's worker, LISTENing, until SIGTERM."""

    name = "pgqueuer"

    def __init__(
        self, database_url: str, hook_url: str, max_tasks: int, log_aggregation: float = 30.0
    ) -> None:
        self.command = [
            sys.executable,
            *("-m", "bench.pgq_listen", "--database-url", database_url, "--url", hook_url),
            *("--max-tasks", str(max_tasks), "--log-aggregation-seconds", str(log_aggregation)),
        ]
        self.producer_env: dict[str, str] = {}
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> PgqueuerService:
        self.process = await asyncio.create_subprocess_exec(
            *self.command, cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), START_TIMEOUT_SECONDS)
        if line.strip() != b"ready":
            raise RuntimeError(f"pgqueuer's worker did not start: {line!r}")
        return self

    def cpu_seconds(self) -> float:
        assert self.process is not None
        return process_cpu(self.process.pid)

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        self.process.send_signal(signal.SIGTERM)
        out = await asyncio.wait_for(self.process.stdout.read(), 60)
        await self.process.wait()
        summary = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        if summary.get("failures"):
            raise AssertionError(f"pgqueuer's entrypoint failed: {summary}")
