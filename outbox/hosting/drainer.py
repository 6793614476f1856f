"""``outbox serve``'s own drains: on its timer, and at each wake-up over PostgreSQL.

The relay keeps the earliest time it wants a run (a backoff, a ``Retry-After``, a breaker's
reopen, messages given back: ``WakeUps``). ``Drainer`` arms a timer for it and drains then,
whether or not a queue is configured or reachable; with ``OUTBOX_WAKEUP=postgres`` it also
drains at each ``NOTIFY`` that ``PostgresListener`` hears. One drain at a time: whatever wakes
it during a drain makes one more drain after it, never one each (no drain storm); and a NOTIFY
heard during a drain tells that drain at once (``OutboxProcessor.more_due``), which leases what
was committed rather than wait for its deliveries in flight to be answered first.

``PostgresListener`` keeps a connection of its own LISTENing. When the database goes away it
connects again (every second at first, then less often, at most every ``RECONNECT_MAX_SECONDS``)
and, once back, drains once: a notification sent while it was away is lost, not the row. While
it is down the relay polls (``WakeUps.listening``): a database that answers the pool but not a
new LISTEN is drained every few seconds, not at the next timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable

from outbox.azure import triggers
from outbox.azure.host import functions_host
from outbox.core.errors import DatabaseError, describe
from outbox.core.logs import Throttled
from outbox.core.redact import Redactor
from outbox.relay.processor import OutboxProcessor
from outbox.relay.wakeups import FALLBACK_POLL_SECONDS, WakeUps
from outbox.store.connection import Connection, ping
from outbox.store.notify import listen_for_wakeups

logger = logging.getLogger("outbox.serve")

# Without a time wanted, the timer looks again this often (a change wakes it at once anyway).
IDLE_SECONDS = 60.0
# How often the LISTENing connection is asked whether it still answers (a cut that sends no
# FIN, a proxy that drops it, is found within this plus the command timeout).
LISTEN_CHECK_SECONDS = 5.0
# A database back from a restart is heard (and drained) within this: a failed connection attempt
# costs the server next to nothing.
RECONNECT_MAX_SECONDS = 2.0
RECONNECT_LOG_INTERVAL_SECONDS = 60.0


async def first_of(*waits: Awaitable[object], within: float | None) -> None:
    """Until one of ``waits`` ends, or ``within`` seconds pass."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Drainer:
    """One drain at a time, when the relay's timer comes due or a wake-up arrives."""

    def __init__(self, redact: Redactor | None = None) -> None:
        self._redact = redact or Redactor([])
        self._woken = asyncio.Event()
        self.drains = 0
        self._processor: OutboxProcessor | None = None
        self._wakeups: WakeUps | None = None
        self._heard = True  # whether the LISTENing connection (if any) is up

    def wake(self) -> None:
        """Drain as soon as the drain under way (if any) ends; that drain leases what came now."""
        self._woken.set()
        if self._processor is not None:
            self._processor.more_due()

    def listening(self, heard: bool) -> None:
        """The LISTENing connection is up (``heard``) or down: while it is down, the relay polls."""
        self._heard = heard
        if self._wakeups is not None:
            self._wakeups.listening(heard, time.monotonic())

    async def run(self, stopping: asyncio.Event) -> None:
        relay = await functions_host.relay()
        self._processor = relay.processor
        self._wakeups = wakeups = relay.wakeups
        if not self._heard:
            wakeups.listening(False, time.monotonic())
        while not stopping.is_set():
            wakeups.changed.clear()
            due_in = wakeups.due_in(time.monotonic())
            if not self._woken.is_set() and (due_in is None or due_in > 0):
                timeout = IDLE_SECONDS if due_in is None else due_in
                await first_of(
                    stopping.wait(), wakeups.changed.wait(), self._woken.wait(), within=timeout
                )
            if stopping.is_set():
                return
            woken = self._woken.is_set()
            self._woken.clear()
            if wakeups.take_due(time.monotonic()) or woken:
                await self._drain("notify" if woken else "due")

    async def _drain(self, trigger: str) -> None:
        self.drains += 1
        try:
            await triggers.drain(trigger, until_caught_up=True)
        except Exception as exc:  # noqa: BLE001 - like a timer's failure: the next wake-up tries
            logger.error("%s drain failed: %s", trigger, self._redact(describe(exc)))


class PostgresListener:
    """LISTENs for wake-ups on a connection of its own, and connects again when it is lost."""

    def __init__(self, url: str, drainer: Drainer) -> None:
        self._url = url
        self._drainer = drainer
        self._throttled = Throttled(logger, RECONNECT_LOG_INTERVAL_SECONDS)

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 1.0
        troubled = False
        while not stopping.is_set():
            lost = asyncio.Event()
            try:
                conn = await listen_for_wakeups(self._url, self._drainer.wake, lost.set)
            except DatabaseError as exc:
                self._throttled(
                    f"wake-ups: cannot LISTEN ({exc.kind}); polling every "
                    f"{FALLBACK_POLL_SECONDS:g} s and trying again"
                )
                self._drainer.listening(False)
                troubled = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                delay = min(delay * 2, RECONNECT_MAX_SECONDS)
                continue
            delay = 1.0
            self._drainer.listening(True)
            if troubled:
                logger.info("wake-ups: listening again; draining what came meanwhile")
                self._drainer.wake()
            troubled = True  # from now on, any new connection follows a lost one
            try:
                await self._watch(conn, lost, stopping)
            finally:
                conn.terminate()
            if not stopping.is_set():
                self._drainer.listening(False)

    async def _watch(self, conn: Connection, lost: asyncio.Event, stopping: asyncio.Event) -> None:
        while not (stopping.is_set() or lost.is_set()):
            await first_of(stopping.wait(), lost.wait(), within=LISTEN_CHECK_SECONDS)
            if stopping.is_set() or lost.is_set():
                break
            try:
                await ping(conn)
            except DatabaseError as exc:
                logger.warning("wake-ups: the LISTENing connection is lost (%s)", exc.kind)
                return
        if lost.is_set() and not stopping.is_set():
            logger.warning("wake-ups: the LISTENing connection is lost")
