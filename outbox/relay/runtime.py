"""The clients one process needs (a database pool, an HTTP session) and the processor over them.

``Relay.open(settings)`` takes the settings its caller built: a command, ``outbox serve``, or the
Functions side's one host (``outbox.azure.host``), which opens one relay per process and shares it.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Self

from outbox.core.clock import DatabaseClock
from outbox.core.models import DrainSummary
from outbox.core.resources import Closeable
from outbox.core.settings import Settings
from outbox.core.telemetry import Telemetry
from outbox.relay.processor import OutboxProcessor
from outbox.relay.wakeups import WakeUps
from outbox.store.connection import Connection, create_pool
from outbox.store.postgres import PostgresStore
from outbox.transport.publisher import Publisher

# The cyclic garbage collector's first threshold in a process that hosts the relay: objects made
# between young collections. With hundreds of requests in flight (and the batches that wait for
# their slowest) thousands of objects stay alive across collections, and Python's default (700)
# makes the collector traverse them again and again: about a third of the process's CPU per
# message at 512 slots (docs/performance.md, "Latency-bound delivery").
YOUNG_COLLECTION_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """Collect the youngest objects every ``YOUNG_COLLECTION_THRESHOLD`` allocations rather than
    every 700 (the older generations' thresholds kept; a higher first threshold kept too). For a
    process that hosts the relay: the Functions worker and ``outbox serve`` call it when they
    open the process's relay; an application that embeds ``Relay`` decides for its process."""
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_COLLECTION_THRESHOLD:
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


class Relay(Closeable):
    """A processor with its own pool and HTTP sessions; close it when done."""

    def __init__(
        self,
        settings: Settings,
        pool: Connection,
        publisher: Publisher,
        clock: DatabaseClock,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.store = PostgresStore(pool)
        self.publisher = publisher
        self.loop = asyncio.get_running_loop()
        self.processor = OutboxProcessor(
            self.store, publisher.deliver, settings, clock=clock, telemetry=telemetry
        )
        # When the next run is wanted, and the hints (queue or NOTIFY) that wake one then.
        self.wakeups = WakeUps(settings, self.store)

    async def drain(
        self,
        budget_seconds: float | None = None,
        *,
        until_caught_up: bool = False,
        trigger: str = "drain",
    ) -> DrainSummary:
        """One run of the processor, then the wake-up the next run needs (if any); after a run
        that caught up, the hints it made redundant are cleared."""
        self.wakeups.run_starting(time.monotonic())
        started = time.time()
        summary = await self.processor.execute(
            budget_seconds, until_caught_up=until_caught_up, trigger=trigger
        )
        await self.wakeups.after_run(self.store, summary)
        if summary.error is None and summary.stopped_by == "drained":
            self.wakeups.clear_covered(started)
        return summary

    async def wake_now(self) -> bool:
        """One wake-up at once (after a requeue): whether a hint was sent."""
        return await self.wakeups.wake_now()

    @classmethod
    async def open(cls, settings: Settings, *, telemetry: Telemetry | None = None) -> Self:
        """Open a relay; ``telemetry`` by default uses the global OpenTelemetry providers: an
        SDK the caller set up before (``outbox.telemetry.configure()``), else the API's no-ops."""
        pool = await create_pool(settings)
        clock = DatabaseClock()  # set by the processor's leases, read by the signatures
        publisher = Publisher.from_settings(settings, clock.time)
        return cls(settings, pool, publisher, clock, telemetry)

    async def close(self) -> None:
        await self.processor.close()
        await self.wakeups.close()
        await self.publisher.close()
        await self.pool.close()
