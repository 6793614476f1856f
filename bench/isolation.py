"""Isolation: how long a dead endpoint holds up a healthy one.

A dead endpoint accepts TCP and never answers (each request runs into the HTTP timeout). Its
``dead`` messages are enqueued before ``healthy`` ones for the benchmark's receiver; one drain
delivers them, and the figure is the time from the drain's start until the last healthy message
is recorded ``Processed``, against the same healthy messages drained alone, and how many requests
the dead endpoint got meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

from bench.common import (
    EVENT_TYPE,
    SECRET,
    Database,
    ReceiverProcess,
    enqueue_outbox,
    log,
    median,
    relay_settings,
)
from outbox.relay.runtime import Relay

DEAD_TYPE = "DeadEndpoint"


class DeadEndpoint:
    """Accepts connections, reads what comes, never answers; counts the requests it was sent."""

    def __init__(self) -> None:
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> DeadEndpoint:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/never"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            await reader.read()  # until the relay gives up and closes the connection
        writer.close()


async def run_once(
    receiver: ReceiverProcess, *, dead: int, healthy: int, http_timeout: float, concurrency: int
) -> dict[str, Any]:
    await receiver.reset()
    async with Database("isolation") as db, DeadEndpoint() as endpoint:
        await db.migrate()
        conn = await db.connect()
        try:
            await enqueue_outbox(conn, dead, event_type=DEAD_TYPE)
            await enqueue_outbox(conn, healthy)
            webhooks = {
                DEAD_TYPE: {"url": endpoint.url},
                EVENT_TYPE: {"url": receiver.url(), "secret": SECRET},
            }
            settings = relay_settings(
                db.url,
                receiver.url(),
                concurrency,
                webhooks=webhooks,
                http_timeout_seconds=http_timeout,
            )
            async with await Relay.open(settings) as relay:
                started = time.monotonic()
                drain = asyncio.create_task(relay.processor.execute(budget_seconds=120))
                while True:
                    done = await conn.fetchval(
                        "SELECT count(*) FROM outbox_messages "
                        "WHERE event_type = $1 AND status = 'Processed'",
                        EVENT_TYPE,
                    )
                    if done == healthy or drain.done():
                        break
                    await asyncio.sleep(0.05)
                seconds = time.monotonic() - started
                requests_then = endpoint.requests
                relay.processor.stop()
                await drain
            failed = await conn.fetchval(
                "SELECT count(*) FROM outbox_messages WHERE status = 'Failed'"
            )
        finally:
            await conn.close()
    if done != healthy:
        raise AssertionError(f"isolation: {done} of {healthy} healthy messages delivered")
    return {
        "healthy_seconds": round(seconds, 3),
        "dead_requests": requests_then,
        "failed": failed,
    }


@contextlib.contextmanager
def _quiet() -> Any:
    """The dead endpoint's retries are warnings by design: not the benchmark's output."""
    logger = logging.getLogger("outbox")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


async def measure(
    receiver: ReceiverProcess,
    *,
    dead: int,
    healthy: int,
    http_timeout: float,
    runs: int,
    concurrency: int,
) -> dict[str, Any]:
    alone, behind = [], []
    once = functools.partial(
        run_once, receiver, healthy=healthy, http_timeout=http_timeout, concurrency=concurrency
    )
    with _quiet():
        for _ in range(runs):  # interleaved: the same minutes of the same machine
            alone.append(await once(dead=0))
            behind.append(await once(dead=dead))
    result = {
        "dead": dead,
        "healthy": healthy,
        "timeout_seconds": http_timeout,
        "alone": alone,
        "behind_dead": behind,
        "alone_seconds_median": median([r["healthy_seconds"] for r in alone]),
        "behind_dead_seconds_median": median([r["healthy_seconds"] for r in behind]),
        "dead_requests_median": median([r["dead_requests"] for r in behind]),
        "failed_by_breaker": max(r["failed"] for r in behind),
    }
    log(
        f"isolation: healthy alone {result['alone_seconds_median']} s, behind a dead endpoint "
        f"{result['behind_dead_seconds_median']} s; dead endpoint got "
        f"{result['dead_requests_median']} requests"
    )
    return result


async def measure_beside(
    receiver: ReceiverProcess,
    *,
    dead: int,
    healthy: int,
    http_timeout: float,
    runs: int,
    concurrency: int,
) -> dict[str, Any]:
    """The healthy endpoint's time beside a blackholed one (no ``max_concurrency``), against its
    time alone, round by round: the ratio's median and spread (target: at most 3)."""
    once = functools.partial(
        run_once, receiver, healthy=healthy, http_timeout=http_timeout, concurrency=concurrency
    )
    rounds = []
    with _quiet():
        for _ in range(runs):
            alone = await once(dead=0)
            beside = await once(dead=dead)
            ratio = beside["healthy_seconds"] / max(alone["healthy_seconds"], 0.001)
            rounds.append({"alone": alone, "beside_dead": beside, "ratio": round(ratio, 2)})
    ratios = [r["ratio"] for r in rounds]
    result = {
        "dead": dead,
        "healthy": healthy,
        "timeout_seconds": http_timeout,
        "rounds": rounds,
        "alone_seconds_median": median([r["alone"]["healthy_seconds"] for r in rounds]),
        "beside_dead_seconds_median": median([r["beside_dead"]["healthy_seconds"] for r in rounds]),
        "ratio_median": median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
        "dead_requests_median": median([r["beside_dead"]["dead_requests"] for r in rounds]),
    }
    log(
        f"beside: healthy alone {result['alone_seconds_median']} s, beside a dead endpoint "
        f"{result['beside_dead_seconds_median']} s; ratio median {result['ratio_median']} "
        f"(spread {min(ratios)}-{max(ratios)}, target <= 3)"
    )
    return result
