"""The one processor every trigger and host runs: lease a batch, deliver it, record the outcomes.

``execute()`` drains: it leases batches until nothing is due or its time budget is spent. The next
batch is leased while the current one is still being delivered, so the HTTP slots stay busy. A
leased message becomes one delivery per endpoint of its event type that still waits for it.
``OUTBOX_CONCURRENCY`` delivery loops, started once per run, take the deliveries endpoint by
endpoint in turn, each endpoint only while it has room (its ``max_concurrency``) and its breaker
lets it; a dead endpoint's deliveries never hold the loops from a healthy one's. Each batch's
outcomes are written in one statement, fenced by the lease token, and shielded from cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from outbox import store
from outbox.core.clock import DatabaseClock
from outbox.core.errors import DatabaseError, describe
from outbox.core.logs import log_event, trace_fields
from outbox.core.models import (
    Attempt,
    Delivered,
    DeliveryResult,
    DrainSummary,
    LeasedMessage,
    NotAttempted,
    Outcome,
    Recorded,
    Response,
    Status,
    TransportError,
    Undeliverable,
)
from outbox.core.outcomes import aggregate, as_tried, classify, unwell
from outbox.core.redact import Redactor
from outbox.core.settings import LEASE_SAFETY_SECONDS, Settings, WebhookEndpoint
from outbox.core.telemetry import Telemetry, process_telemetry, span_ids
from outbox.relay.admission import Admission, Slots
from outbox.relay.breakers import PROBE, SEND, Breakers, Key
from outbox.relay.stopping import StopRule, stop_rule

logger = logging.getLogger("outbox.processor")
batch_logger = logging.getLogger("outbox.batch")
delivery_logger = logging.getLogger("outbox.delivery")
_OUTCOME_LEVELS = {
    Status.PROCESSED: logging.DEBUG,
    Status.PENDING: logging.WARNING,
    Status.FAILED: logging.ERROR,
}

T = TypeVar("T")

# Batches leased ahead of the one being delivered: one is enough to keep every slot busy.
MAX_BATCHES_IN_FLIGHT = 2
# Batches still open (delivering or writing their outcomes). Outcome writes do not hold up the
# next lease, so a slow commit does not leave the HTTP slots idle; this bounds them.
MAX_BATCHES_OPEN = 2 * MAX_BATCHES_IN_FLIGHT
NOT_SENT = "run interrupted before this message was sent"
# Outcome writes are retried this often (the pool replaces a dropped connection in between).
RECORD_RETRY_DELAYS = (0.2, 1.0, 3.0)
Deliver = Callable[[LeasedMessage, WebhookEndpoint], Awaitable[DeliveryResult]]


@dataclass(eq=False)
class _Run:
    """One ``execute()``: its summary, the end of its budget, and the rule that decides its end."""

    summary: DrainSummary
    # Monotonic: no lease and no delivery starts later.
    deadline: float
    rule: StopRule


class _Target(NamedTuple):
    """An endpoint of an event type, as every delivery to it needs it."""

    endpoint: WebhookEndpoint
    key: Key  # (event type, endpoint name)
    timeout: float  # seconds one request to it may take


class _Delivery:
    """One leased message to one of its endpoints, while the run delivers it."""

    # One is made per message and endpoint: a plain class with slots is the cheapest to make.
    __slots__ = (
        "attempt",
        "batch",
        "endpoint",
        "index",
        "key",
        "number",
        "probe",
        "queued",
        "started",
        "timeout",
    )

    def __init__(self, batch: _Batch, index: int, target: _Target, number: int) -> None:
        self.batch = batch
        self.index = index  # the message's, in its batch
        self.endpoint, self.key, self.timeout = target
        self.number = number  # the endpoint's attempt number: 1 on its first delivery
        # Its attempt, the exception that escaped it, or None (not finished).
        self.attempt: Attempt | BaseException | None = None
        # When its request started (wall clock, monotonic), or None (not started).
        self.started: tuple[float, float] | None = None
        self.queued = True  # still waits for a delivery slot (counted by the admission)
        self.probe = False  # the one request that decides whether the endpoint's breaker closes

    @property
    def message(self) -> LeasedMessage:
        return self.batch.messages[self.index]


@dataclass(eq=False)
class _Batch:
    """One leased batch while its deliveries are made by the run's delivery loops."""

    messages: list[LeasedMessage]
    lease_deadline: float
    run: _Run
    # Resolved when every delivery has an attempt (or the batch is abandoned on cancellation).
    delivered: asyncio.Future[None]
    # Per message: its deliveries (one per endpoint still waiting), or why it has none.
    deliveries: list[list[_Delivery] | Undeliverable] = field(default_factory=list)
    remaining: int = 0
    # Set once its outcomes are being written: a delivery not yet started is not made any more.
    closed: bool = field(default=False, init=False)

    def all_deliveries(self) -> list[_Delivery]:
        return [d for planned in self.deliveries if isinstance(planned, list) for d in planned]

    def settle(self, delivery: _Delivery, attempt: Attempt | BaseException | None) -> None:
        if attempt is not None:
            delivery.attempt = attempt
        self.remaining -= 1
        if self.remaining <= 0 and not self.delivered.done():
            self.delivered.set_result(None)


class _Dispatch:
    """The run's deliveries waiting for a loop: a queue per endpoint, taken in turn, each only
    while its endpoint has room (``has_room``), so that a slow endpoint's queue never holds a
    loop from the others'."""

    def __init__(
        self,
        has_room: Callable[[Key], bool],
        waiting: dict[Key, int],
        moot: Callable[[_Delivery], bool],
    ) -> None:
        self._has_room = has_room
        self._moot = moot  # whether a delivery will not be sent now (taken whatever the room)
        self._waiting = waiting  # per endpoint, in every run's dispatch (``_EndpointSlots``)
        self._queues: dict[Key, deque[_Delivery]] = {}
        self._turn: deque[Key] = deque()  # endpoints with deliveries waiting, in turn
        self._changed = asyncio.Event()

    def put(self, delivery: _Delivery) -> None:
        key = delivery.key
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        if not queue:
            self._turn.append(key)
        queue.append(delivery)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        self._changed.set()

    def wake(self) -> None:
        """An endpoint may have room again: loops waiting for one with room look again (none
        need to while no delivery waits)."""
        if self._turn:
            self._changed.set()

    def take_now(self) -> _Delivery | None:
        """The next delivery whose endpoint has room, if one waits."""
        for _ in range(len(self._turn)):
            key = self._turn[0]
            self._turn.rotate(-1)
            if self._has_room(key) or self._moot(self._queues[key][0]):
                return self._pop(key)
        return None

    async def take(self) -> _Delivery:
        """The next delivery whose endpoint has room, once there is one."""
        while (delivery := self.take_now()) is None:
            self._changed.clear()
            await self._changed.wait()
        return delivery

    def _pop(self, key: Key) -> _Delivery:
        queue = self._queues[key]
        delivery = queue.popleft()
        self._waiting[key] -= 1
        if not queue:
            self._turn.remove(key)
        return delivery

    def clear(self) -> None:
        """The run is over: what still waits here is not counted as waiting any more."""
        for key, queue in self._queues.items():
            self._waiting[key] -= len(queue)
            queue.clear()
        self._turn.clear()


class _EndpointSlots:
    """Per endpoint in this process: requests in flight, deliveries waiting for a loop, and its
    room: its ``max_concurrency``, and its fair share of the slots while others have work.

    The fair share is ``ceil(slots / endpoints contending)``. An endpoint contends while
    deliveries to it wait here, or while it may have due messages the process has not leased:
    until a lease comes back short without one for it (it is then quiet until a lease comes back
    full: more may be due than it read). So an endpoint goes
    beyond its share only once the others are known to have nothing due; a dead endpoint's first
    batch takes half the slots beside one other endpoint, not all of them."""

    def __init__(self, slots: int, caps: dict[Key, int | None]) -> None:
        self._slots = slots
        self._caps = caps
        # Below this, every endpoint has room (the share were every endpoint contending).
        self._least = math.ceil(slots / max(len(caps), 1))
        self._in_flight: dict[Key, int] = {}
        self.waiting: dict[Key, int] = {}  # deliveries queued in every run's dispatch
        self._quiet: set[Key] = set()  # the last short lease found nothing due for them
        self.listeners: set[_Dispatch] = set()

    def has_room(self, key: Key) -> bool:
        in_flight = self._in_flight.get(key, 0)
        cap = self._caps.get(key)
        if cap is not None and in_flight >= cap:
            return False
        return in_flight < self._least or in_flight < self._share(key)

    def _share(self, key: Key) -> int:
        others = sum(
            1
            for other in self._caps
            if other != key and (self.waiting.get(other) or other not in self._quiet)
        )
        return math.ceil(self._slots / (others + 1))

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
        self._quiet.update((self._caps.keys() if looked_at is None else looked_at) - keys)
        for dispatch in self.listeners:  # the others' shares may have grown
            dispatch.wake()

    def found(self, key: Key) -> None:
        """A lease found a message for ``key``."""
        self._quiet.discard(key)

    def unsure(self) -> None:
        """A lease came back full without reading past anything: any endpoint may have more due
        (the run's next lease reads past those at their share, if any is)."""
        self._quiet.clear()

    def take(self, key: Key) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def give_back(self, key: Key) -> None:
        self._in_flight[key] -= 1
        for dispatch in self.listeners:
            dispatch.wake()


class OutboxProcessor:
    """Drains the outbox: shared by the queue, timer and HTTP triggers (and ``outbox serve``)."""

    def __init__(
        self,
        pool: store.Connection,
        deliver: Deliver,
        settings: Settings,
        *,
        redact: Redactor | None = None,
        clock: DatabaseClock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._pool = pool
        self._deliver = deliver
        self._settings = settings
        # Set at each lease, read by the publisher (webhook-timestamp) and for Retry-After dates.
        self.clock = clock or DatabaseClock()
        self._redact = redact or Redactor.from_settings(settings)
        self._slots = Slots(settings.concurrency)
        self._admission = Admission(settings.concurrency)
        self._hold = settings.ordering_on_failure == "hold"
        self._stopping = False
        self._endpoints = settings.endpoints
        self._targets = {
            event_type: tuple(
                _Target(e, (event_type, _name(e)), e.timeout(settings.http_timeout_seconds))
                for e in group
            )
            for event_type, group in self._endpoints.items()
        }
        caps = {
            key: endpoint.max_concurrency
            for targets in self._targets.values()
            for endpoint, key, _ in targets
        }
        self._endpoint_slots = _EndpointSlots(settings.concurrency, caps)
        self._breakers = Breakers(pool, self._other_endpoints)
        # Spans and metrics: the API's no-ops unless an OpenTelemetry SDK is configured.
        self._telemetry = telemetry or process_telemetry()

    def stop(self) -> None:
        """Make running drains finish what is in flight, release the rest, and return."""
        self._stopping = True

    async def execute(
        self,
        budget_seconds: float | None = None,
        *,
        until_caught_up: bool = False,
        trigger: str = "drain",
    ) -> DrainSummary:
        """Deliver due messages until none is due, the budget is spent, or ``stop()`` is called.

        ``until_caught_up`` (a wake-up hint's run): end once a lease comes back short and its
        deliveries are done, unless what it recorded is due again already; otherwise (a drain)
        lease until a lease finds nothing, having first let go what a change outside the relay
        left parked. ``outbox.stopping`` holds both rules.

        Database errors (unreachable, connection lost, schema missing) end the run early; they
        are reported in ``summary.error`` rather than raised, and whatever was leased stays safe
        under its lease.

        ``trigger`` names what started the run, on its span (queue, timer, http, startup, …).
        """
        with self._telemetry.run(trigger) as span:
            summary = await self._execute(budget_seconds, until_caught_up=until_caught_up)
            self._telemetry.ran(span, summary)
        return summary

    async def _execute(
        self, budget_seconds: float | None, *, until_caught_up: bool
    ) -> DrainSummary:
        summary = DrainSummary()
        started = time.monotonic()
        budget = min(budget_seconds or self._settings.run_budget_seconds, 3600.0)
        run = _Run(summary, started + budget, stop_rule(until_caught_up=until_caught_up))
        batches: set[asyncio.Task[None]] = set()
        work = _Dispatch(self._has_room, self._endpoint_slots.waiting, self._moot)
        self._endpoint_slots.listeners.add(work)
        loops = [
            asyncio.create_task(self._deliver_loop(work)) for _ in range(self._settings.concurrency)
        ]
        try:
            if run.rule.sweeps:
                await store.release_held(self._pool, hold_on_failure=self._hold)
            await self._drain(run, batches, work)
        except DatabaseError as exc:
            self._report_database_error(summary, exc)
        except asyncio.CancelledError:
            # Interrupt the deliveries; each batch still records what it has (shielded).
            for task in (*batches, *loops):
                task.cancel()
            raise
        finally:
            try:
                await self._finish(batches)
            finally:
                # Also when cancelled while the last batches finish: no loop outlives the run.
                for task in loops:
                    task.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
                self._endpoint_slots.listeners.discard(work)
                work.clear()
                summary.duration_seconds = time.monotonic() - started
        return summary

    async def _drain(self, run: _Run, batches: set[asyncio.Task[None]], work: _Dispatch) -> None:
        # Batches whose deliveries are still running; each is resolved before its outcome write.
        delivering: set[asyncio.Future[None]] = set()
        loop = asyncio.get_running_loop()
        while not self._ends(run):
            skip, size = self._look_past(run, batches)
            if not skip and not (size := await self._lease_size(run, delivering, batches)):
                continue  # it waited for room: everything above may have changed
            lease_deadline = time.monotonic() + self._settings.lease_seconds
            lease = await self._lease(size, skip)
            if lease.messages:
                messages = await self._as_tried(lease.messages)
                batch = _Batch(messages, lease_deadline, run, loop.create_future())
                self._start(batch, work, delivering, batches)
            if skip:
                continue  # it read past some endpoints' messages: it cannot tell if all is done
            if lease.taken < size:
                if not lease.taken and not batches:
                    return
                # Caught up: let the in-flight batches finish (their retries may come due),
                # then the run's rule says whether to lease once more.
                await self._finish(batches)
                if run.rule.caught_up():
                    return

    def _ends(self, run: _Run) -> bool:
        """Whether the run leases no more: an outcome write failed for good (leasing more would
        only strand rows), it is told to stop, or its budget is spent."""
        summary = run.summary
        if summary.error:
            return True
        if self._stopping:
            summary.stopped_by = "stopped"
            return True
        if time.monotonic() >= run.deadline:
            summary.stopped_by = "budget"
            return True
        return False

    async def _lease_size(
        self, run: _Run, delivering: set[asyncio.Future[None]], batches: set[asyncio.Task[None]]
    ) -> int:
        """How many messages the run leases now; 0 after it waited while it, or the whole
        process, had as much leased as can be delivered soon."""
        if len(delivering) >= MAX_BATCHES_IN_FLIGHT or len(batches) >= MAX_BATCHES_OPEN:
            busy = delivering if len(delivering) >= MAX_BATCHES_IN_FLIGHT else batches
            await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
            return 0
        window = self._start_window(run, time.monotonic())
        size = self._admission.room(window, self._settings.batch_size)
        if not size:
            await self._admission.wait(run.deadline)
        return size

    def _look_past(self, run: _Run, batches: set[asyncio.Task[None]]) -> tuple[list[str], int]:
        """The event types to lease past, and how many messages to lease, when deliveries wait
        for endpoints that are at their share while others may have due messages not leased
        yet: their next lease reads past the waiting endpoints' messages; else ``([], 0)``."""
        slots = self._endpoint_slots
        blocked = slots.blocked() if len(batches) < MAX_BATCHES_OPEN else ()
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

    def _found(self, lease: store.Lease, size: int, skip: list[str]) -> None:
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

    async def _lease(self, size: int, skip: list[str]) -> store.Lease:
        """Lease up to ``size`` messages, counted as waiting from before the statement is sent;
        ``skip``: event types whose messages it reads past (``_look_past``)."""
        self._admission.reserve(size)
        leased = 0
        sent, asked = time.time(), time.monotonic()
        try:
            lease = await store.lease_batch(
                self._pool,
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
                self.clock.observe(lease.database_now, sent, time.time())
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
            tried = await store.endpoints_tried(self._pool, retried)
        except DatabaseError as exc:  # the outcome write will say more; send them as leased
            logger.warning("attempt history not read (%s): endpoints as the rows say", exc.kind)
            return messages
        return [
            as_tried(m, self._endpoint_names(m.event_type), tried.get(m.message_id, ()))
            for m in messages
        ]

    def _endpoint_names(self, event_type: str) -> list[str]:
        return [_name(e) for e in self._endpoints.get(event_type, ())]

    def _start_window(self, run: _Run, now: float) -> float:
        """Seconds from ``now`` within which a message leased now must start to be sent."""
        last_start = self._settings.lease_seconds - (
            self._settings.longest_timeout_seconds + LEASE_SAFETY_SECONDS
        )
        return min(run.deadline - now, last_start)

    def _plan(self, batch: _Batch) -> None:
        """Each message's deliveries: one per endpoint of its event type still waiting for it."""
        for index, message in enumerate(batch.messages):
            targets = self._targets.get(message.event_type)
            if not targets:
                batch.deliveries.append(
                    Undeliverable(
                        f"no endpoint configured for event type {message.event_type!r} "
                        "(OUTBOX_WEBHOOKS)"
                    )
                )
                continue
            if message.endpoint_state is None:  # every endpoint tried at each lease so far
                number = message.attempt
                batch.deliveries.append([_Delivery(batch, index, t, number) for t in targets])
                continue
            batch.deliveries.append(
                [
                    _Delivery(batch, index, t, _next_attempt(message, t.key[1]))
                    for t in targets
                    if _waits(message, t.key[1])
                ]
            )
        batch.remaining = len(batch.all_deliveries())
        if not batch.remaining:
            batch.delivered.set_result(None)

    def _has_room(self, key: Key) -> bool:
        """Whether a delivery to ``key`` may be taken now: under its max_concurrency, and not
        while this process's probe of its breaker waits for an answer."""
        return self._endpoint_slots.has_room(key) and not self._breakers.holds_back(key)

    def _moot(self, delivery: _Delivery) -> bool:
        """Whether ``delivery`` will not be sent now: then it need not wait for room."""
        return self._not_sent_because(delivery, time.monotonic()) is not None

    def _other_endpoints(self, key: Key) -> Sequence[str]:
        event_type, name = key
        return [_name(e) for e in self._endpoints.get(event_type, ()) if _name(e) != name]

    def _start(
        self,
        batch: _Batch,
        work: _Dispatch,
        delivering: set[asyncio.Future[None]],
        batches: set[asyncio.Task[None]],
    ) -> None:
        """Hand a leased batch's deliveries to the delivery loops; a task records its outcomes."""
        batch.run.summary.leased += len(batch.messages)
        batch.run.summary.batches += 1
        self._plan(batch)
        # Counted as waiting by the lease, one per message: one per delivery from now on.
        self._admission.reserve(batch.remaining - len(batch.messages))
        if batch.remaining:
            delivering.add(batch.delivered)
            batch.delivered.add_done_callback(delivering.discard)
        for delivery in batch.all_deliveries():
            work.put(delivery)
        task = asyncio.create_task(self._run_batch(batch))
        batches.add(task)
        task.add_done_callback(batches.discard)

    async def _deliver_loop(self, work: _Dispatch) -> None:
        """One of the run's delivery loops: deliveries one at a time, endpoint by endpoint."""
        while True:
            delivery = work.take_now() or await work.take()
            attempt: Attempt | BaseException | None = None
            try:
                attempt = await self._attempt(delivery)
            except Exception as exc:  # noqa: BLE001 - unexpected: becomes this delivery's outcome
                attempt = exc
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the run is being cancelled: stop this loop
                attempt = exc  # raised by the delivery itself: that delivery's outcome only
            finally:
                # Also on cancellation (attempt None): the batch records it as interrupted if it
                # was sent, or releases it if it was not.
                delivery.batch.settle(delivery, attempt)

    async def _run_batch(self, batch: _Batch) -> None:
        try:
            await asyncio.shield(batch.delivered)
        finally:
            # The drain may lease the next batch while this one writes its outcomes.
            if not batch.delivered.done():
                batch.delivered.set_result(None)
            # Also on cancellation: whatever finished is recorded, whatever was sent and did not
            # finish is retried, whatever was not sent is released (and will not be sent now).
            batch.closed = True
            for delivery in batch.all_deliveries():
                self._leave(delivery)
            try:
                await shielded(self._record_batch(batch))
            finally:
                # Its deliveries point back at it: let them all go now, with the last reference,
                # rather than wait for a garbage collection (batches would pile up meanwhile).
                batch.deliveries.clear()

    async def _record_batch(self, batch: _Batch) -> None:
        """Write a finished batch's outcomes; the usual batch (all delivered) in the lean way."""
        await self._breakers.flush()
        if (sent := _all_sent(batch)) is not None:
            await self._record_sent(batch, sent)
            return
        now = self.clock.now()  # a Retry-After date is the receiver's idea of this time
        records = [self._outcome(batch, index, now) for index in range(len(batch.messages))]
        await self._record(records, batch.run)

    async def _attempt(self, delivery: _Delivery) -> Attempt:
        key = delivery.key
        self._endpoint_slots.take(key)
        try:
            return await self._attempt_in_turn(delivery)
        finally:
            self._endpoint_slots.give_back(key)

    async def _attempt_in_turn(self, delivery: _Delivery) -> Attempt:
        # Asked before waiting for a slot too: the slots are shared with the process's other
        # runs, and a delivery this run will not make must not wait behind their requests.
        held = self._not_sent(delivery, time.monotonic())
        if held is None and self._breakers.verdict(delivery.key) != SEND:
            held = await self._held_by_breaker(delivery)
        if held is not None:
            self._leave(delivery)
            return Attempt(held, time.time(), 0)
        answered = False
        try:
            waited = not self._slots.take_now()
            if waited:
                await self._slots.take()
            try:
                self._leave(delivery)
                now, started = time.time(), time.monotonic()
                # Asked again after waiting for the slot, or for the probe's claim: time passed.
                if (waited or delivery.probe) and (
                    reason := self._not_sent_because(delivery, started)
                ):
                    return Attempt(NotAttempted(reason), now, 0)
                delivery.started = (now, started)
                telemetry = self._telemetry
                if telemetry.tracing or telemetry.metering:
                    result, took, trace = await self._deliver_traced(delivery, started)
                else:  # no SDK: no span to start, nothing to count
                    result = await self._deliver(delivery.message, delivery.endpoint)
                    took, trace = time.monotonic() - started, None
                    self._admission.finished(took)
            finally:
                self._slots.give_back()
            observed = self._breakers.observed(delivery.key, unwell(result), probe=delivery.probe)
            answered = True
        finally:
            if delivery.probe and not answered:
                # The probe was not made (or came to no answer): give it back, or the
                # endpoint's other deliveries would wait for its answer for ever.
                self._breakers.observed(delivery.key, None, probe=True)
        if observed is not None:
            await observed
        return Attempt(result, now, round(took * 1000), trace)

    async def _deliver_traced(
        self, delivery: _Delivery, started: float
    ) -> tuple[DeliveryResult, float, tuple[str, str] | None]:
        """The delivery in its span, and counted: its result, how long it took and its span."""
        message, (event_type, name) = delivery.message, delivery.key
        with self._telemetry.delivery(
            message_id=str(message.message_id),
            event_type=event_type,
            endpoint=name,
            url=delivery.endpoint.url,
            attempt=delivery.number,
            stored=message.trace_context,
        ) as span:
            result = await self._deliver(message, delivery.endpoint)
            took = time.monotonic() - started
            self._admission.finished(took)
            if self._telemetry.observing(span):
                self._telemetry.delivered(
                    span,
                    result,
                    event_type=event_type,
                    endpoint=name,
                    outcome=self._outcome_label(result, delivery),
                    seconds=took,
                    created_at=message.created_at,
                    now=self.clock.now(),
                )
        return result, took, span_ids(span.get_span_context())

    def _outcome_label(self, result: DeliveryResult, delivery: _Delivery) -> str:
        """What ``result`` comes to for its endpoint (Processed, Pending, Failed), for telemetry;
        the outcome written is decided with the batch's (``_delivered``)."""
        attempt = Attempt(result, time.time(), 0)
        try:
            outcome = self._classify(
                attempt, delivery.number, delivery.endpoint.final_statuses, self.clock.now()
            )
        except Exception:  # noqa: BLE001 - recorded as retried, as _delivered does
            return str(Status.PENDING)
        return str(outcome.status)

    def _not_sent(self, delivery: _Delivery, at: float) -> NotAttempted | None:
        if reason := self._not_sent_because(delivery, at):
            return NotAttempted(reason)
        return None

    async def _held_by_breaker(self, delivery: _Delivery) -> NotAttempted | None:
        """Why ``delivery`` waits for its endpoint's breaker (and for how long), if it does: it
        is open, or another delivery probes it; None when this one is the probe."""
        verdict = self._breakers.verdict(delivery.key)
        if verdict == SEND:
            return None
        if verdict == PROBE and await self._breakers.claim_probe(delivery.key, delivery.timeout):
            delivery.probe = True
            return None
        wait = delivery.timeout if isinstance(verdict, str) else verdict
        return NotAttempted("endpoint's circuit breaker open", retry_in=wait)

    def _leave(self, delivery: _Delivery) -> None:
        """The delivery no longer waits for a slot (it starts, or it will not be made now)."""
        if delivery.queued:
            delivery.queued = False
            self._admission.release()

    def _not_sent_because(self, delivery: _Delivery, at: float) -> str | None:
        """Why ``delivery`` must not start at ``at`` (monotonic), if it must not."""
        batch = delivery.batch
        if self._stopping:
            return "relay stopping"
        if batch.closed:
            return NOT_SENT
        if at >= batch.run.deadline:
            # A run ends at most one HTTP timeout after its budget, whatever the lease.
            return "run budget spent"
        if batch.lease_deadline - at < delivery.timeout + LEASE_SAFETY_SECONDS:
            return "lease too short to finish a delivery"
        return None

    def _outcome(self, batch: _Batch, index: int, now: datetime) -> Recorded:
        message, planned = batch.messages[index], batch.deliveries[index]
        if isinstance(planned, Undeliverable):
            attempt = Attempt(planned, now.timestamp(), 0)
            outcome = self._classify(attempt, 1, (), now)
            return Recorded(message, outcome, (Delivered(None, message.attempt, attempt, outcome),))
        delivered = tuple(self._delivered(delivery, now) for delivery in planned)
        names = self._endpoint_names(message.event_type)
        outcome, state = aggregate(message, delivered, names)
        return Recorded(message, outcome, delivered, state)

    def _delivered(self, delivery: _Delivery, now: datetime) -> Delivered:
        attempt = delivery.attempt
        if not isinstance(attempt, Attempt):
            attempt = self._broken_attempt(attempt, delivery.started, now)
        final = delivery.endpoint.final_statuses
        try:
            outcome = self._classify(attempt, delivery.number, final, now)
        except Exception as exc:  # noqa: BLE001 - an answer nobody foresaw must not cost the batch
            attempt = attempt._replace(result=self._unexpected(exc))
            outcome = self._classify(attempt, delivery.number, final, now)
        return Delivered(_name(delivery.endpoint), delivery.number, attempt, outcome)

    def _classify(
        self, attempt: Attempt, number: int, final_statuses: Sequence[int], now: datetime
    ) -> Outcome:
        return classify(
            attempt.result,
            attempt=number,
            max_attempts=self._settings.max_attempts,
            now=now,
            final_statuses=final_statuses,
        )

    def _unexpected(self, error: BaseException) -> TransportError:
        """An exception as a retryable result, its text redacted."""
        name = type(error).__name__
        return TransportError(self._redact(f"unexpected {name}: {error}"), name)

    def _broken_attempt(
        self, error: BaseException | None, started: tuple[float, float] | None, now: datetime
    ) -> Attempt:
        """An attempt that did not return: never sent, interrupted, or failed unexpectedly."""
        if error is not None:
            result: DeliveryResult = self._unexpected(error)
        elif started is None:
            # Never sent (the run was cancelled first): given back as it was, not counted.
            return Attempt(NotAttempted(NOT_SENT), now.timestamp(), 0)
        else:
            # The request may have reached the receiver: count the attempt and retry later.
            result = TransportError("delivery interrupted before it completed", "Interrupted")
        if started is None:
            return Attempt(result, now.timestamp(), 0)
        return Attempt(result, started[0], round((time.monotonic() - started[1]) * 1000))

    async def _record(self, records: list[Recorded], run: _Run) -> None:
        def write(retrying: bool) -> Awaitable[store.Written]:
            return store.record_outcomes(
                self._pool, records, hold_on_failure=self._hold, retrying=retrying
            )

        written = await self._write(write, len(records), run.summary)
        if written is None:
            return
        run.rule.recorded(records, written.lets_next_go)
        batch = DrainSummary(leased=len(records))
        for record in records:
            applied = record.message.message_id in written.applied
            log_outcome(record, applied=applied)
            for counts in (run.summary, batch):
                if applied:
                    counts.count(record.outcome)
                else:
                    counts.stale += 1
        _log_batch(batch)

    async def _record_sent(self, batch: _Batch, sent: list[store.SentAttempt]) -> None:
        """Record a batch whose every message was delivered (``_all_sent``)."""
        messages = batch.messages

        def write(retrying: bool) -> Awaitable[store.Written]:
            return store.record_delivered(
                self._pool, messages, sent, hold_on_failure=self._hold, retrying=retrying
            )

        summary = batch.run.summary
        written = await self._write(write, len(messages), summary)
        if written is None:
            return
        batch.run.rule.recorded((), written.lets_next_go)
        stale = len(messages) - len(written.applied)
        if stale or delivery_logger.isEnabledFor(logging.DEBUG):
            now = self.clock.now()
            for index, message in enumerate(messages):
                applied = message.message_id in written.applied
                log_outcome(self._outcome(batch, index, now), applied=applied)
        summary.processed += len(messages) - stale
        summary.stale += stale
        _log_batch(DrainSummary(leased=len(messages), processed=len(messages) - stale, stale=stale))

    async def _write(
        self, write: Callable[[bool], Awaitable[store.Written]], count: int, summary: DrainSummary
    ) -> store.Written | None:
        """Run an outcome ``write`` (given whether it repeats one whose reply was lost), retried
        after transient errors; None when it failed for good: the run's error says why."""
        tries = 0

        async def attempt() -> store.Written:
            nonlocal tries
            tries += 1
            # A retry may follow a write that committed before its connection was lost.
            return await write(tries > 1)

        try:
            return await retry_database(attempt)
        except DatabaseError as exc:
            # The rows stay Processing; once their lease expires they are delivered again.
            summary.unrecorded += count
            self._report_database_error(summary, exc)
        except Exception as exc:  # noqa: BLE001 - a bug: in the summary, not only in a log line
            summary.unrecorded += count
            self._report_error(summary, f"outcome write failed: {describe(exc)}")
        return None

    async def _finish(self, tasks: set[asyncio.Task[None]]) -> None:
        """Wait for every task in ``tasks``; their own errors are logged (redacted), not raised."""
        while tasks:
            snapshot = list(tasks)
            results = await asyncio.gather(*snapshot, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    text = self._redact(describe(result))
                    logger.error("outbox batch failed: %s", text)
            tasks.difference_update(snapshot)

    def _report_database_error(self, summary: DrainSummary, exc: DatabaseError) -> None:
        self._report_error(summary, f"database error: {exc}")

    def _report_error(self, summary: DrainSummary, text: str) -> None:
        summary.stopped_by = "error"
        summary.error = self._redact(text)
        logger.error("outbox drain: %s", summary.error)


def _all_sent(batch: _Batch) -> list[store.SentAttempt] | None:
    """The batch's attempts, if each message was answered 2xx (no text kept) by every endpoint of
    its event type with nothing kept from before (all Processed: ``store.record_delivered``);
    else None."""
    sent: list[store.SentAttempt] = []
    for message, planned in zip(batch.messages, batch.deliveries, strict=True):
        if message.endpoint_state is not None or not isinstance(planned, list):
            return None
        for delivery in planned:
            attempt = delivery.attempt
            if not isinstance(attempt, Attempt):
                return None
            result = attempt.result
            if not isinstance(result, Response) or not 200 <= result.status < 300 or result.snippet:
                return None  # (a snippet: kept by the general statement only)
            sent.append(
                store.SentAttempt(
                    message.message_id,
                    _name(delivery.endpoint),
                    delivery.number,
                    attempt.started_epoch,
                    attempt.duration_ms,
                    result.status,
                )
            )
    return sent


def _log_batch(batch: DrainSummary) -> None:
    log_event(
        batch_logger,
        logging.INFO,
        "outbox.batch",
        leased=batch.leased,
        processed=batch.processed,
        retried=batch.retried,
        failed=batch.failed,
        released=batch.released,
        stale=batch.stale,
    )


def log_outcome(record: Recorded, *, applied: bool) -> None:
    """One line per delivery: DEBUG when delivered, WARNING when retried, ERROR when failed."""
    for delivered in record.deliveries:
        outcome, attempt = delivered.outcome, delivered.attempt
        if not applied:
            level, label = logging.WARNING, "Stale"
        elif outcome.not_attempted:
            # One line per run says how many were given back (its summary's released).
            level, label = logging.DEBUG, "Released"
        else:
            level, label = _OUTCOME_LEVELS[outcome.status], str(outcome.status)
        if not delivery_logger.isEnabledFor(level):
            continue  # most runs: DEBUG (delivered) is off; skip building the fields
        result = attempt.result
        log_event(
            delivery_logger,
            level,
            "outbox.delivery",
            message_id=record.message.message_id,
            event_type=record.message.event_type,
            endpoint=delivered.endpoint,
            attempt=delivered.number,
            outcome=label,
            http_status=result.status if isinstance(result, Response) else None,
            duration_ms=attempt.duration_ms,
            retry_in_s=round(outcome.delay_seconds, 1) if label == "Pending" else None,
            error=outcome.error,
            **trace_fields(attempt.trace),
        )


def _waits(message: LeasedMessage, endpoint: str) -> bool:
    """Whether ``endpoint`` has still to get ``message`` (not delivered, not failed for good)."""
    state = message.endpoint_state
    return state is None or endpoint not in state or state[endpoint].status is Status.PENDING


def _next_attempt(message: LeasedMessage, endpoint: str) -> int:
    """The number of the attempt to ``endpoint`` that this lease makes."""
    state = message.endpoint_state
    if state is None:
        return message.attempt  # every endpoint tried at each lease so far
    return state[endpoint].attempts + 1 if endpoint in state else 1


def _name(endpoint: WebhookEndpoint) -> str:
    assert endpoint.name is not None  # named by Settings
    return endpoint.name


async def retry_database(operation: Callable[[], Awaitable[T]]) -> T:
    """Run ``operation``, retrying after transient database errors (a new connection may work)."""
    for delay in RECORD_RETRY_DELAYS:
        try:
            return await operation()
        except DatabaseError as exc:
            if not exc.transient:
                raise
            logger.warning("database write failed (%s); retrying in %.1fs", exc.kind, delay)
            await asyncio.sleep(delay)
    return await operation()


async def shielded(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` to completion even if the caller is cancelled, then re-raise the cancellation.

    Used for outcome writes: a cancelled invocation must not lose a status update.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result
