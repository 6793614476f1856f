"""Lease: a run's loop, leasing batch after batch until its stop rule, budget or a stop ends it.

Each lease takes at most what the process's delivery slots can start in time (``admission``),
and while deliveries wait for endpoints at their share of the slots, it reads past those
endpoints' messages (``look_past``) so that others' due messages are not left behind them. The
next batches are leased while the current ones are delivered: enough messages to keep the slots
busy while each batch waits for its slowest request (``messages_in_flight``), counted in
messages, not batches, as a moderate rate leases a few at a time.
After a lease that came back short (caught up), the run waits for its batches in flight, unless a
wake-up hint comes first (``more_due``: a producer committed): it then leases at once, so that a
message committed meanwhile waits neither for the receiver's slowest answer nor for another run.
Each leased batch is handed to ``start`` (plan → dispatch → deliver → record: the processor).

Fast paths (docs/performance.md):
- The usual batch size is passed as ``usual_size``: the store writes it into the lease
  statement, planned once per connection instead of at every lease (§ "The lease's batch size in
  its SQL").
- At least two batches in flight, not one: one batch in flight was measured and dropped
  (§ "Latency-bound delivery", at least two batches in flight; the measurement is in the
  benchmarks' journal, 2026-12-02).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from outbox.core.clock import DatabaseClock
from outbox.core.errors import DatabaseError
from outbox.core.models import LeasedMessage
from outbox.core.outcomes import as_tried
from outbox.core.redact import Redactor
from outbox.core.settings import LEASE_SAFETY_SECONDS, Settings, WebhookEndpoint
from outbox.relay.admission import Admission
from outbox.relay.batch import Batch, Run, Targets, endpoint_names, finish_unless
from outbox.relay.breakers import BreakerBook
from outbox.relay.dispatch import EndpointSlots
from outbox.relay.stopping import StopSignal
from outbox.store.contract import Lease, RelayStore

logger = logging.getLogger("outbox.processor")

# Batches' worth of messages being delivered at once, at least: one leased ahead of the one
# being delivered.
MIN_BATCHES_IN_FLIGHT = 2
# Messages being delivered at once, per delivery slot: a batch waits for its slowest request,
# so its last requests leave slots free that only the next batches can fill. Four, not two:
# against receivers whose answer times spread (lognormal, sigma 0.5: the slowest of a batch of
# 100 takes about 3.5 times the median), two left a third of the slots idle (docs/performance.md
# section "Latency-bound delivery").
MESSAGES_IN_FLIGHT_PER_SLOT = 4
# Leased messages waiting for a slot, per delivery slot, at most (the memory bound).
WAITING_PER_SLOT = 2


def max_waiting(settings: Settings) -> int:
    """Leased messages the process lets wait for a slot at most (the memory bound)."""
    return WAITING_PER_SLOT * max(settings.concurrency, settings.batch_size)


def messages_in_flight(concurrency: int, batch_size: int) -> int:
    """Messages a run delivers at once: enough for ``concurrency`` slots (``docs/performance.md``
    § "Latency-bound delivery"). Counted in messages, not batches: at a moderate rate each lease
    takes a few, and as many batches as a full one's worth would leave the slots idle. Twice as
    many may be open (delivering or writing their outcomes: a slow commit does not leave the HTTP
    slots idle); this bounds them."""
    return max(MIN_BATCHES_IN_FLIGHT * batch_size, MESSAGES_IN_FLIGHT_PER_SLOT * concurrency)


class InFlight:
    """A run's leased messages: those whose batch is still delivering, and those whose batch is
    open (not yet recorded); with the futures to wait on for each to go down."""

    def __init__(self) -> None:
        self.delivering = 0
        self.open = 0
        self.deliveries: set[asyncio.Future[None]] = set()  # batches still delivering

    def add(self, batch: Batch, recorded: asyncio.Task[None]) -> None:
        count = len(batch.messages)
        self.open += count
        recorded.add_done_callback(lambda _: self._closed(count))
        if batch.remaining:
            self.delivering += count
            self.deliveries.add(batch.delivered)
            batch.delivered.add_done_callback(lambda done: self._delivered(done, count))

    def _closed(self, count: int) -> None:
        self.open -= count

    def _delivered(self, done: asyncio.Future[None], count: int) -> None:
        self.delivering -= count
        self.deliveries.discard(done)


class Leaser:
    """Leases a run's batches for the process's delivery slots."""

    def __init__(
        self,
        relay_store: RelayStore,
        settings: Settings,
        *,
        targets: Targets,
        endpoints: Mapping[str, Sequence[WebhookEndpoint]],
        admission: Admission,
        endpoint_slots: EndpointSlots,
        breakers: BreakerBook,
        clock: DatabaseClock,
        stop: StopSignal,
        redact: Redactor,
    ) -> None:
        self._store = relay_store
        self._settings = settings
        self._hold = settings.ordering_on_failure == "hold"
        self._targets = targets
        self._endpoints = endpoints
        self._admission = admission
        self._endpoint_slots = endpoint_slots
        self._breakers = breakers
        self._clock = clock
        self._stop = stop
        self._redact = redact
        self._in_flight = messages_in_flight(settings.concurrency, settings.batch_size)
        self._open = 2 * self._in_flight
        # Runs' futures resolved by the next wake-up hint (``more_due``).
        self._hints: set[asyncio.Future[None]] = set()

    def more_due(self) -> None:
        """A wake-up hint came (a producer committed): a run waiting for its batches in flight
        after a short lease leases again now."""
        for hint in self._hints:
            if not hint.done():
                hint.set_result(None)
        self._hints.clear()

    async def drain(
        self,
        run: Run,
        batches: set[asyncio.Task[None]],
        start: Callable[[Batch], asyncio.Task[None]],
    ) -> None:
        """Lease until the run ends; each leased batch goes to ``start``, which adds the task
        that records it to ``batches`` and returns it."""
        leased = InFlight()
        loop = asyncio.get_running_loop()
        hint = loop.create_future()
        try:
            while not self.ends(run):
                skip, size = self._look_past(run, leased)
                if not skip and not (size := await self._lease_size(run, leased, batches)):
                    continue  # it waited for room: everything above may have changed
                if hint.done():  # a hint before this lease: the lease reads what it stood for
                    hint = loop.create_future()
                self._hints.add(hint)
                lease_deadline = time.monotonic() + self._settings.lease_seconds
                lease = await self._lease(size, skip)
                if lease.messages:
                    messages = await self._as_tried(lease.messages)
                    batch = Batch(messages, lease_deadline, run, loop.create_future())
                    leased.add(batch, start(batch))
                if skip or lease.taken >= size:
                    continue  # more may be due: a full lease, or one that read past some
                if not lease.taken and not batches:
                    return
                if await self._caught_up(run, batches, hint):
                    return
        finally:
            self._hints.discard(hint)

    async def _caught_up(
        self, run: Run, batches: set[asyncio.Task[None]], hint: asyncio.Future[None]
    ) -> bool:
        """After a short lease: let the in-flight batches finish (their retries may come due),
        then the run's rule says whether the run ends; a wake-up ``hint`` first: lease again."""
        if not await finish_unless(batches, self._redact, hint):
            return False
        return run.rule.caught_up()

    def ends(self, run: Run) -> bool:
        """Whether the run leases no more: an outcome write failed for good (leasing more would
        only strand rows), it is told to stop, or its budget is spent."""
        summary = run.summary
        if summary.error:
            return True
        if self._stop.requested:
            summary.stopped_by = "stopped"
            return True
        if time.monotonic() >= run.deadline:
            summary.stopped_by = "budget"
            return True
        return False

    async def _lease_size(
        self, run: Run, leased: InFlight, batches: set[asyncio.Task[None]]
    ) -> int:
        """How many messages the run leases now; 0 after it waited while it, or the whole
        process, had as much leased as can be delivered soon."""
        if leased.delivering >= self._in_flight or leased.open >= self._open:
            busy = leased.deliveries if leased.delivering >= self._in_flight else batches
            await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
            return 0
        window = self._start_window(run, time.monotonic())
        size = self._admission.room(window, self._settings.batch_size)
        if not size:
            await self._admission.wait(run.deadline)
        return size

    def _look_past(self, run: Run, leased: InFlight) -> tuple[list[str], int]:
        """The event types to lease past, and how many messages to lease, when deliveries wait
        for endpoints that are at their share while others may have due messages not leased
        yet: their next lease reads past the waiting endpoints' messages; else ``([], 0)``."""
        slots = self._endpoint_slots
        blocked = slots.blocked() if leased.open < self._open else ()
        if not blocked:
            return [], 0
        skip = [
            kind
            for kind, targets in self._targets.items()
            if all(t.key in blocked for t in targets)
        ]
        skipped = {t.key for kind in skip for t in self._targets[kind]}
        if not skip or not slots.unknown(skipped):
            return [], 0
        # What waits for the blocked endpoints does not take the slots the lease is for.
        others = max(0, self._admission.waiting - sum(slots.waiting.get(k, 0) for k in skipped))
        window = self._start_window(run, time.monotonic())
        size = self._admission.room(window, self._settings.batch_size, waiting=others)
        return (skip, size) if size else ([], 0)

    def _found(self, lease: Lease, size: int, skip: list[str]) -> None:
        """What a lease tells of the endpoints: those it found messages for contend for the
        slots; if it came back short, those it looked for and found nothing for are quiet."""
        slots = self._endpoint_slots
        found = {
            t.key
            for kind in {m.event_type for m in lease.messages}
            for t in self._targets.get(kind, ())
        }
        for key in found:
            slots.found(key)
        if lease.taken >= size and not skip:
            slots.unsure()
        elif lease.taken < size:
            looked = (
                None
                if not skip
                else {
                    t.key
                    for kind, targets in self._targets.items()
                    if kind not in skip
                    for t in targets
                }
            )
            slots.leased(found, looked)

    async def _lease(self, size: int, skip: list[str]) -> Lease:
        """Lease up to ``size`` messages, counted as waiting from before the statement is sent;
        ``skip``: event types whose messages it reads past (``_look_past``)."""
        self._admission.reserve(size)
        leased = 0
        sent, asked = time.time(), time.monotonic()
        try:
            lease = await self._store.lease_batch(
                size,
                self._settings.lease_seconds,
                hold_on_failure=self._hold,
                max_payload_bytes=self._settings.max_payload_bytes,
                usual_size=self._settings.batch_size,
                skip=skip,
            )
            leased = len(lease.messages)
            self._found(lease, size, skip)
            if lease.database_now is not None:
                self._clock.observe(lease.database_now, sent, time.time())
            if lease.troubled is not None:
                self._breakers.learn(lease.troubled, as_of=asked)
            return lease
        finally:
            self._admission.release(size - leased)

    async def _as_tried(self, messages: list[LeasedMessage]) -> list[LeasedMessage]:
        """The leased messages, those retried without an endpoint state made explicit where their
        attempt history shows an endpoint that was never sent them (``outcomes.as_tried``)."""
        retried = [
            m.message_id
            for m in messages
            if m.endpoint_state is None and m.attempt > 1 and self._endpoints.get(m.event_type)
        ]
        if not retried:
            return messages
        try:
            tried = await self._store.endpoints_tried(retried)
        except DatabaseError as exc:  # the outcome write will say more; send them as leased
            logger.warning("attempt history not read (%s): endpoints as the rows say", exc.kind)
            return messages
        return [
            as_tried(m, endpoint_names(self._endpoints, m.event_type), tried.get(m.message_id, ()))
            for m in messages
        ]

    def _start_window(self, run: Run, now: float) -> float:
        """Seconds from ``now`` within which a message leased now must start to be sent."""
        last_start = self._settings.lease_seconds - (
            self._settings.longest_timeout_seconds + LEASE_SAFETY_SECONDS
        )
        return min(run.deadline - now, last_start)
