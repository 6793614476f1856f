"""How much a process's runs may lease: what its delivery slots can start in time.

Leased messages wait for one of the process's slots, shared by every run (hint, timer and HTTP
drains at once). A message that cannot start before its run's budget ends, or before its lease
is too short, is given back and leased again later: with many runs, or a slow receiver, leasing
more than can start only turns in circles. So a run leases at most what the slots can start, at
the pace the process's recent requests took, before the earlier of its budget's end and the
lease's last start time, less what already waits; and never more than ``max_waiting`` leased
messages wait for a slot in the whole process (the memory bound: ``lease.max_waiting``, twice
``OUTBOX_CONCURRENCY`` or one batch, whichever is larger).

Fast path (docs/performance.md § "The relay's own CPU", its table of changes): ``Slots`` is a
semaphore whose free slot is taken without a coroutine ("a free delivery slot taken without a
coroutine"); an asyncio semaphore per delivery was tried and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque

# Bounds for the pace of requests that admission assumes, and for one wait for room.
MIN_PACE_SECONDS = 0.001
MAX_ROOM_WAIT_SECONDS = 0.5
# How much of each new request's duration the smoothed pace takes in.
PACE_WEIGHT = 0.2


class Admission:
    """The process's count of leased messages waiting for a slot, and its pace of requests."""

    def __init__(self, concurrency: int, max_waiting: float | None = None) -> None:
        self.concurrency = concurrency
        # Leased messages the process lets wait for a slot at most (leased, not yet sent).
        self.max_waiting = math.inf if max_waiting is None else max_waiting
        self.waiting = 0
        # Seconds per request, smoothed; None until the first one has finished.
        self.pace: float | None = None

    def reserve(self, count: int) -> None:
        """Count ``count`` messages as waiting before they are leased (other runs lease too)."""
        self.waiting += count

    def release(self, count: int = 1) -> None:
        """Stop counting ``count`` messages: not leased after all, started, or not to be sent."""
        self.waiting -= count

    def finished(self, seconds: float) -> None:
        """A request took ``seconds``."""
        if self.pace is None:
            self.pace = seconds
        else:
            self.pace += PACE_WEIGHT * (seconds - self.pace)

    def room(self, within: float, batch_size: int, *, waiting: int | None = None) -> int:
        """How many messages to lease now, for slots that must start them ``within`` seconds;
        ``waiting``: what waits for those slots, if not all that waits (``self.waiting``)."""
        ahead = self.waiting if waiting is None else waiting
        if self.pace is None:  # no request has finished yet: one batch, to learn the pace
            return 0 if ahead else batch_size
        startable = self.concurrency * within / max(self.pace, MIN_PACE_SECONDS)
        # Bounded by what the whole process lets wait, whatever ``waiting`` leaves out.
        bound = self.max_waiting - self.waiting
        return max(0, min(batch_size, math.floor(startable) - ahead, int(min(bound, batch_size))))

    async def wait(self, until: float) -> None:
        """Let some of what waits start (about one request's time), at most ``until``."""
        pause = min(max(self.pace or 0.0, MIN_PACE_SECONDS), MAX_ROOM_WAIT_SECONDS)
        await asyncio.sleep(max(0.0, min(pause, until - time.monotonic())))


class Slots:
    """The process's delivery slots (``OUTBOX_CONCURRENCY`` requests at once), shared by its
    runs: a semaphore whose free slot is taken without a coroutine (``take_now``), first come
    first served."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a slot if one is free and nobody waits for one."""
        if self._free and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Take a slot, waiting for one in turn."""
        if self.take_now():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():
                with contextlib.suppress(ValueError):  # unless a give_back passed over it
                    self._waiters.remove(waiter)
            else:  # handed a slot as it was cancelled: the next in turn gets it
                self.give_back()
            raise

    def give_back(self) -> None:
        """Give a slot back: to the first waiter, else to the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
