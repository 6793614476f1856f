"""Latency: commit → webhook received, with the relay woken by a hint per message.

A producer commits one event at a time at a steady rate (``outbox.transaction``: enqueue, commit,
then the wake-up hint to a real Azurite queue). A consumer process stands in for the Functions
host's queue trigger (``bench.worker hints``: one ``triggers.on_hint`` per hint). The producer
stamps ``committedAt`` into the payload just before the commit; the receiver subtracts it from
its own clock on arrival (one machine, one clock), so the figure includes the commit itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import asyncpg

import outbox
from bench.common import (
    EVENT_TYPE,
    ROOT,
    SECRET,
    Database,
    ReceiverProcess,
    log,
    median,
    outbox_counts,
    payload,
    percentile,
)
from outbox.core.settings import QueueSettings, Settings
from outbox.relay.runtime import Relay
from outbox.transport.wakeup import WakeUpQueue, make_queue_client
from tests.support.azurite import Azurite

QUEUE_NAME = "outbox-wakeup"
# Nothing new at the receiver for this long after the last commit: the rest lost their hints.
HINT_PATH_QUIET_SECONDS = 10.0


async def produce(pool: Any, queue: WakeUpQueue, i: int) -> None:
    async with pool.acquire() as conn, outbox.transaction(conn, queue) as tx:
        await tx.enqueue(EVENT_TYPE, {**payload(i), "committedAt": time.time()})


async def offer(pool: Any, queue: WakeUpQueue, messages: int, rate: float) -> float:
    """Commit ``messages`` events at ``rate`` per second (on schedule, not back to back)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = []
    for i in range(messages):
        await asyncio.sleep(max(0.0, started + i / rate - loop.time()))
        tasks.append(asyncio.create_task(produce(pool, queue, i)))
    await asyncio.gather(*tasks)
    return messages / (loop.time() - started)


async def wait_for_all(receiver: ReceiverProcess, messages: int, within: float) -> None:
    deadline = time.monotonic() + within
    while (await receiver.stats()).distinct < messages:
        if time.monotonic() > deadline:
            raise AssertionError(f"latency: not every message arrived within {within:g}s")
        await asyncio.sleep(0.2)


async def wait_for_hint_path(receiver: ReceiverProcess, messages: int, quiet: float) -> int:
    """Wait until every message arrived or none has for ``quiet`` s; the requests seen so far."""
    seen, last_change = -1, time.monotonic()
    while True:
        stats = await receiver.stats()
        if stats.distinct >= messages:
            return stats.requests
        if stats.requests != seen:
            seen, last_change = stats.requests, time.monotonic()
        elif time.monotonic() - last_change > quiet:
            return stats.requests
        await asyncio.sleep(0.2)


async def sweep(env: dict[str, str]) -> int:
    """What the five-minute timer does for rows whose hint was lost: one drain."""
    settings = Settings.load(
        database_url=env["OUTBOX_DATABASE_URL"],
        webhooks=json.loads(env["OUTBOX_WEBHOOKS"]),
        concurrency=int(env["OUTBOX_CONCURRENCY"]),
    )
    async with await Relay.open(settings) as relay:
        summary = await relay.processor.execute()
    return summary.processed


async def queue_depth(azurite: Azurite) -> int:
    """Hints still queued once every message arrived: each drain takes everything due, so the
    consumer (one hint at a time, as host.json asks) falls behind a hint per message."""
    settings = QueueSettings.load(queue_connection=azurite.connection_string, queue_name=QUEUE_NAME)
    async with make_queue_client(settings) as client:
        properties = await client.get_queue_properties()
    return int(properties.approximate_message_count or 0)


def start_consumer(env: dict[str, str]) -> subprocess.Popen[str]:
    """The hint consumer, once it has its queue, its pool and its session (a warm worker)."""
    consumer = subprocess.Popen(
        [sys.executable, "-m", "bench.worker", "hints"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None
    if consumer.stdout.readline().strip() != "ready":
        consumer.kill()
        raise RuntimeError("the hint consumer did not start")
    return consumer


async def run_once(
    receiver: ReceiverProcess, azurite: Azurite, messages: int, rate: float, concurrency: int
) -> dict[str, Any]:
    async with Database("latency") as db:
        await db.migrate()
        env = {
            "OUTBOX_DATABASE_URL": db.url,
            "OUTBOX_WEBHOOKS": json.dumps(
                {EVENT_TYPE: {"url": receiver.url("/latency"), "secret": SECRET}}
            ),
            "OUTBOX_CONCURRENCY": str(concurrency),
            "OUTBOX_QUEUE_NAME": QUEUE_NAME,
            "AzureWebJobsStorage": azurite.connection_string,
        }
        queue = WakeUpQueue.from_settings(
            QueueSettings.load(queue_connection=azurite.connection_string, queue_name=QUEUE_NAME)
        )
        await receiver.reset()
        consumer = start_consumer(env)
        pool = await asyncpg.create_pool(db.url, min_size=4, max_size=8)
        swept = 0
        try:
            offered = await offer(pool, queue, messages, rate)
            hint_path = await wait_for_hint_path(receiver, messages, quiet=HINT_PATH_QUIET_SECONDS)
            hints_left = await queue_depth(azurite)
            if (await receiver.stats()).distinct < messages:
                # Some hints were lost (the queue timed out: the producer logged each one). In
                # production the timer sweeps these rows; here the sweep runs now. They are
                # counted, and left out of the percentiles: they did not take the hint path.
                swept = await sweep(env)
                await wait_for_all(receiver, messages, within=30)
        finally:
            consumer.terminate()
            out, _ = consumer.communicate(timeout=30)
            await pool.close()
            await queue.close()
        conn = await db.connect()
        try:
            counts = await outbox_counts(conn)
        finally:
            await conn.close()
    if counts != {"Processed": messages}:
        raise AssertionError(f"latency: rows by status {counts}")
    latencies = [1000 * x for x in (await receiver.stats()).latencies[:hint_path]]
    result = {
        "messages": messages,
        "offered_rate": round(offered, 1),
        "drains": json.loads(out.strip().splitlines()[-1])["drains"],
        "swept": swept,
        "hints_left": hints_left,
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
    }
    log(f"latency: {result}")
    return result


async def measure(
    receiver: ReceiverProcess, *, messages: int, rate: float, runs: int, concurrency: int
) -> dict[str, Any]:
    # The queue service only, in memory; the hint queue is created by the first notify().
    results = []
    for _ in range(runs):
        # A fresh emulator per run: hints a run leaves behind would slow the next one down
        # (Azurite, unlike the storage service, gets slower as its queue grows).
        azurite = Azurite().start()
        try:
            results.append(await run_once(receiver, azurite, messages, rate, concurrency))
        finally:
            azurite.stop()
    return {
        "rate": rate,
        "runs": results,
        "swept": sum(r["swept"] for r in results),
        "median": {
            key: median([r[key] for r in results]) for key in ("p50_ms", "p95_ms", "p99_ms")
        },
    }
