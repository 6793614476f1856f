"""Deliver: the run's delivery loops, and one delivery attempt from its slot to its answer.

A loop takes the next delivery whose endpoint has room (``Dispatch``) and attempts it: it starts
only if the relay is not stopping, its batch still takes deliveries, the run's budget is not
spent, its lease outlasts its timeout, and its endpoint's breaker lets it (or it claims the
breaker's probe). It then waits for one of the process's delivery slots, checks the same again if
time passed, sends, and tells the breaker the answer; what the breaker's book decides to persist,
its writer writes (``outbox.relay.breaker_store``), and the endpoint's adaptive limit of requests
in flight follows the answer (``outbox.relay.limits``).

Fast paths (docs/performance.md):
- Telemetry off: with no OpenTelemetry SDK the delivery makes no span and counts nothing: it
  takes its own branch in ``_send`` (``_send_traced`` is the other). One path for both would
  run a span's machinery, even as the API's no-ops, per message ("no span machinery without an
  SDK", § "The relay's own CPU"; judged in § "Telemetry off").
- A free delivery slot is taken without a coroutine (``Slots.take_now``; "a free delivery slot
  taken without a coroutine", § "The relay's own CPU").
- A healthy endpoint's answer awaits nothing for its breaker (``BreakerBook.observed`` returns
  None; "a healthy endpoint's breaker costs no coroutine", § "The relay's own CPU").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from outbox.core.clock import DatabaseClock
from outbox.core.models import Attempt, DeliveryResult, LeasedMessage, NotAttempted
from outbox.core.outcomes import unwell
from outbox.core.settings import LEASE_SAFETY_SECONDS, WebhookEndpoint
from outbox.core.telemetry import Telemetry, span_ids
from outbox.relay.admission import Admission, Slots
from outbox.relay.batch import Batch, Delivery
from outbox.relay.breaker_store import BreakerWriter
from outbox.relay.breakers import PROBE, SEND, Key
from outbox.relay.classify import NOT_SENT, Classifier
from outbox.relay.dispatch import Dispatch, EndpointSlots
from outbox.relay.stopping import StopSignal

Deliver = Callable[[LeasedMessage, WebhookEndpoint], Awaitable[DeliveryResult]]


class Deliverer:
    """Makes the run's deliveries: at most one request per process slot, each in turn."""

    def __init__(
        self,
        deliver: Deliver,
        *,
        slots: Slots,
        admission: Admission,
        endpoint_slots: EndpointSlots,
        breakers: BreakerWriter,
        telemetry: Telemetry,
        classifier: Classifier,
        clock: DatabaseClock,
        stop: StopSignal,
    ) -> None:
        self._deliver = deliver
        self._slots = slots
        self._admission = admission
        self._endpoint_slots = endpoint_slots
        self._breakers = breakers
        self._book = breakers.book
        self._telemetry = telemetry
        self._classifier = classifier
        self._clock = clock
        self._stop = stop

    def has_room(self, key: Key) -> bool:
        """Whether a delivery to ``key`` may be taken now: under its max_concurrency, and not
        while this process's probe of its breaker waits for an answer."""
        return self._endpoint_slots.has_room(key) and not self._book.holds_back(key)

    def will_not_start(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` will not be sent now: then it need not wait for room."""
        return self._reason_not_to_start(delivery, time.monotonic()) is not None

    def close(self, batch: Batch) -> None:
        """The batch's outcomes are about to be written: its deliveries not started yet are not
        made any more, and stop counting as waiting for a slot."""
        batch.closed = True
        for delivery in batch.all_deliveries():
            self._stop_waiting(delivery)

    async def loop(self, work: Dispatch) -> None:
        """One of the run's delivery loops: deliveries one at a time, endpoint by endpoint."""
        while True:
            delivery = work.take_now() or await work.take()
            attempt: Attempt | BaseException | None = None
            try:
                attempt = await self._attempt(delivery, work)
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

    async def _attempt(self, delivery: Delivery, work: Dispatch) -> Attempt:
        key = delivery.key
        self._endpoint_slots.take(key)
        try:
            return await self._attempt_in_turn(delivery)
        finally:
            # This loop looks for its next delivery at once: its own run's loops need no wake.
            self._endpoint_slots.give_back(key, work)

    async def _attempt_in_turn(self, delivery: Delivery) -> Attempt:
        # Asked before waiting for a slot too: the slots are shared with the process's other
        # runs, and a delivery this run will not make must not wait behind their requests.
        refused = self._not_attempted(delivery, time.monotonic())
        if refused is None and self._book.verdict(delivery.key) != SEND:
            refused = await self._breaker_refusal(delivery)
        if refused is not None:
            self._stop_waiting(delivery)
            return Attempt(refused, time.time(), 0)
        try:
            attempt = await self._send(delivery)
        except BaseException:
            self._give_back_probe(delivery)
            raise
        if delivery.started is None:  # not started after all
            self._give_back_probe(delivery)
            return attempt
        decision = self._book.observed(delivery.key, unwell(attempt.result), probe=delivery.probe)
        if decision is not None:
            await self._breakers.write(decision)
        return attempt

    async def _send(self, delivery: Delivery) -> Attempt:
        """The request, in one of the process's delivery slots; a ``NotAttempted`` attempt if,
        once a slot is free, the delivery must not start any more (``delivery.started`` None)."""
        waited = not self._slots.take_now()
        if waited:
            await self._slots.take()
        try:
            self._stop_waiting(delivery)
            now, started = time.time(), time.monotonic()
            # Asked again after waiting for the slot, or for the probe's claim: time passed.
            if (waited or delivery.probe) and (
                reason := self._reason_not_to_start(delivery, started)
            ):
                return Attempt(NotAttempted(reason), now, 0)
            delivery.started = (now, started)
            telemetry = self._telemetry
            if telemetry.tracing or telemetry.metering:
                result, took, trace = await self._send_traced(delivery, started)
            else:  # no SDK: no span to start, nothing to count
                result = await self._deliver(delivery.message, delivery.endpoint)
                took, trace = time.monotonic() - started, None
                self._admission.finished(took)
            self._endpoint_slots.answered(delivery.key, result, took, started + took)
        finally:
            self._slots.give_back()
        return Attempt(result, now, round(took * 1000), trace)

    async def _send_traced(
        self, delivery: Delivery, started: float
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
                    outcome=self._classifier.label(result, delivery, self._clock.now()),
                    seconds=took,
                    created_at=message.created_at,
                    now=self._clock.now(),
                )
        return result, took, span_ids(span.get_span_context())

    def _give_back_probe(self, delivery: Delivery) -> None:
        """The probe was not made (or came to no answer): give it back, or the endpoint's other
        deliveries would wait for its answer for ever."""
        if delivery.probe:
            self._book.observed(delivery.key, None, probe=True)

    async def _breaker_refusal(self, delivery: Delivery) -> NotAttempted | None:
        """Why ``delivery`` waits for its endpoint's breaker (and for how long), if it does: it
        is open, or another delivery probes it; None when this one is the probe."""
        verdict = self._book.verdict(delivery.key)
        if verdict == SEND:
            return None
        if verdict == PROBE and await self._breakers.claim_probe(delivery.key, delivery.timeout):
            delivery.probe = True
            return None
        wait = delivery.timeout if isinstance(verdict, str) else verdict
        if self._book.paused(delivery.key):
            return NotAttempted("endpoint paused", retry_in=wait)
        return NotAttempted("endpoint's circuit breaker open", retry_in=wait)

    def _stop_waiting(self, delivery: Delivery) -> None:
        """The delivery no longer waits for a slot (it starts, or it will not be made now)."""
        if delivery.queued:
            delivery.queued = False
            self._admission.release()

    def _not_attempted(self, delivery: Delivery, at: float) -> NotAttempted | None:
        """``delivery``'s result if it must not start at ``at`` (monotonic), else None."""
        if reason := self._reason_not_to_start(delivery, at):
            return NotAttempted(reason)
        return None

    def _reason_not_to_start(self, delivery: Delivery, at: float) -> str | None:
        """Why ``delivery`` must not start at ``at`` (monotonic), if it must not."""
        batch = delivery.batch
        if self._stop.requested:
            return "relay stopping"
        if batch.closed:
            return NOT_SENT
        if at >= batch.run.deadline:
            # A run ends at most one HTTP timeout after its budget, whatever the lease.
            return "run budget spent"
        if batch.lease_deadline - at < delivery.timeout + LEASE_SAFETY_SECONDS:
            return "lease too short to finish a delivery"
        return None
