"""Dispatch: the deliveries waiting for a delivery loop, and each endpoint's room in the process.

A run's deliveries wait in one queue per endpoint (``Dispatch``); the run's delivery loops take
them endpoint by endpoint in turn, each endpoint only while it has room: its ``max_concurrency``
and its fair share of the slots while others have work (``EndpointSlots``). A slow or dead
endpoint keeps at most its own share busy, never the queue in front of the others.

Fast paths (docs/performance.md § "The relay's own CPU", its table of changes):
- ``take_now``: a loop takes a waiting delivery without a coroutine ("a loop takes waiting work
  without a coroutine"); ``take`` awaits only when nothing can be taken.
- ``wake``: idle loops are not woken while nothing waits ("idle loops not woken while nothing
  waits"), and then only as many as may take a delivery: each idle loop waits on its own
  future, not on one event that wakes them all (a run may have hundreds of loops); the room a
  finished request leaves wakes no loop of its own run, whose loop looks at once.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from outbox.core.models import DeliveryResult
from outbox.relay.batch import Delivery
from outbox.relay.breakers import Key
from outbox.relay.limits import AdaptiveLimit


class Dispatch:
    """The run's deliveries waiting for a loop: a queue per endpoint, taken in turn, each only
    while its endpoint has room (``has_room``), so that a slow endpoint's queue never holds a
    loop from the others'."""

    def __init__(
        self,
        has_room: Callable[[Key], bool],
        slots: EndpointSlots,
        will_not_start: Callable[[Delivery], bool],
    ) -> None:
        self._has_room = has_room
        # Whether a delivery will not be sent now: taken whatever the room, to be given back.
        self._will_not_start = will_not_start
        self._slots = slots  # counts what waits per endpoint, in every run's dispatch
        self._queues: dict[Key, deque[Delivery]] = {}
        self._turn: deque[Key] = deque()  # endpoints with deliveries waiting, in turn
        self._idle: deque[asyncio.Future[None]] = deque()  # loops waiting for a delivery

    def put(self, delivery: Delivery) -> bool:
        """Queue ``delivery``; whether an idle loop was woken to take it."""
        key = delivery.key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        if not queue:
            self._turn.append(key)
        queue.append(delivery)
        self._slots.queued(key, 1)
        return self._signal(1) == 0

    def wake(self, count: int = 1) -> None:
        """Room for ``count`` more requests may have come: as many idle loops look again (none
        need to while no delivery waits)."""
        if self._turn:
            self._signal(count)

    def _signal(self, count: int) -> int:
        """Wake up to ``count`` idle loops; how many of the ``count`` found none."""
        idle = self._idle
        while count and idle:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1
        return count

    def take_now(self) -> Delivery | None:
        """The next delivery whose endpoint has room, if one waits."""
        for _ in range(len(self._turn)):
            key = self._turn[0]
            self._turn.rotate(-1)
            if self._has_room(key) or self._will_not_start(self._queues[key][0]):
                return self._pop(key)
        return None

    async def take(self) -> Delivery:
        """The next delivery whose endpoint has room, once there is one."""
        while (delivery := self.take_now()) is None:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if not waiter.cancelled():  # woken as it was cancelled: wake another instead
                    self._signal(1)
                raise
        return delivery

    def _pop(self, key: Key) -> Delivery:
        queue = self._queues[key]
        delivery = queue.popleft()
        self._slots.dequeued(key, 1)
        if not queue:
            self._turn.remove(key)
        return delivery

    def clear(self) -> None:
        """The run is over: what still waits here is not counted as waiting any more."""
        for key, queue in self._queues.items():
            if queue:
                self._slots.dequeued(key, len(queue))
                queue.clear()
        self._turn.clear()
        for waiter in self._idle:
            waiter.cancel()
        self._idle.clear()


class EndpointSlots:
    """Per endpoint in this process: requests in flight, deliveries waiting for a loop, and its
    room: its adaptive limit (``relay.limits``, within its ``max_concurrency``), and its fair
    share of the slots while others have work.

    The fair share is ``ceil(slots / endpoints contending)``. An endpoint contends while
    deliveries to it wait here, or while it may have due messages the process has not leased:
    until a lease comes back short without one for it (it is then quiet until a lease comes back
    full: more may be due than it read). So an endpoint goes
    beyond its share only once the others are known to have nothing due; a dead endpoint's first
    batch takes half the slots beside one other endpoint, not all of them. The endpoints
    contending are counted as they start and stop (``_contending``), not at each check: with
    1,000 endpoints counting them took a fifth of the relay's time (docs/performance.md, "Many
    endpoints")."""

    def __init__(self, slots: int, caps: dict[Key, int | None]) -> None:
        self._slots = slots
        self._caps = caps
        # Each endpoint's adaptive limit (``relay.limits``), resumed and kept by ``limit_store``.
        self.limits = {key: AdaptiveLimit(min(cap or slots, slots)) for key, cap in caps.items()}
        # Below this, every endpoint has room (the share were every endpoint contending).
        self._least = math.ceil(slots / max(len(caps), 1))
        self._in_flight: dict[Key, int] = {}
        self.waiting: dict[Key, int] = {}  # deliveries queued in every run's dispatch
        self._quiet: set[Key] = set()  # the last short lease found nothing due for them
        # Endpoints with deliveries waiting or not quiet: all of them until a lease says.
        self._contending = len(caps)
        self.listeners: set[Dispatch] = set()

    def has_room(self, key: Key) -> bool:
        in_flight = self._in_flight.get(key, 0)
        limit = self.limits.get(key)
        if limit is not None and not limit.allows(in_flight):
            return False
        return in_flight < self._least or in_flight < self._share(key)

    def _share(self, key: Key) -> int:
        others = self._contending - (1 if self._contends(key) else 0)
        return math.ceil(self._slots / (others + 1))

    def _contends(self, key: Key) -> bool:
        return key in self._caps and (bool(self.waiting.get(key)) or key not in self._quiet)

    def queued(self, key: Key, count: int) -> None:
        """``count`` deliveries to ``key`` wait in a run's dispatch."""
        before = self.waiting.get(key, 0)
        self.waiting[key] = before + count
        if not before and key in self._quiet and key in self._caps:
            self._contending += 1

    def dequeued(self, key: Key, count: int) -> None:
        """``count`` deliveries to ``key`` wait no more (taken, or their run is over)."""
        left = self.waiting[key] - count
        self.waiting[key] = left
        if not left and key in self._quiet and key in self._caps:
            self._contending -= 1

    def blocked(self) -> set[Key]:
        """The endpoints whose deliveries wait here and cannot start now (at share, at cap)."""
        return {key for key, count in self.waiting.items() if count and not self.has_room(key)}

    def unknown(self, skipped: set[Key]) -> bool:
        """Whether an endpoint not in ``skipped`` may have due messages this process has not
        leased (none of its deliveries waits here, and no lease has found it quiet lately)."""
        return any(
            key not in skipped and not self.waiting.get(key) and key not in self._quiet
            for key in self._caps
        )

    def leased(self, keys: set[Key], looked_at: set[Key] | None) -> None:
        """A lease that came back short found nothing more due for the endpoints it
        ``looked_at`` (None: every endpoint) but ``keys``: they are quiet."""
        for key in (self._caps.keys() if looked_at is None else looked_at) - keys:
            if key not in self._quiet:
                self._quiet.add(key)
                if key in self._caps and not self.waiting.get(key):
                    self._contending -= 1
        for dispatch in self.listeners:  # the others' shares may have grown
            dispatch.wake(self._slots)

    def found(self, key: Key) -> None:
        """A lease found a message for ``key``."""
        if key in self._quiet:
            self._quiet.discard(key)
            if key in self._caps and not self.waiting.get(key):
                self._contending += 1

    def unsure(self) -> None:
        """A lease came back full without reading past anything: any endpoint may have more due
        (the run's next lease reads past those at their share, if any is)."""
        self._contending = len(self._caps)
        self._quiet.clear()

    def take(self, key: Key) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def give_back(self, key: Key, taker: Dispatch | None = None) -> None:
        """A request to ``key`` ended; ``taker``: the dispatch whose loop gives it back and looks
        for its next delivery at once (none of its idle loops needs waking for this room)."""
        self._in_flight[key] -= 1
        for dispatch in self.listeners:
            if dispatch is not taker:
                dispatch.wake()

    def answered(self, key: Key, result: DeliveryResult, seconds: float, now: float) -> None:
        """A request to ``key`` came back: its limit follows the answer (``relay.limits``)."""
        limit = self.limits.get(key)
        if limit is None:
            return
        before = limit.limit
        limit.answered(result, seconds, now, self._in_flight.get(key))
        if math.ceil(limit.limit) > math.ceil(before):  # room for one more: a loop may take it
            for dispatch in self.listeners:
                dispatch.wake()

    def limit(self, key: Key) -> float:
        """``key``'s limit of requests in flight now."""
        return self.limits[key].limit
