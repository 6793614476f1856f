"""The one processor every trigger and host runs: lease a batch, deliver it, record the outcomes.

``execute()`` drains: it leases batches until nothing is due or its time budget is spent. The next
batch is leased while the current one is still being delivered, so the HTTP slots stay busy. A
leased message becomes one delivery per endpoint of its event type that still waits for it.
Up to ``OUTBOX_CONCURRENCY`` delivery loops, started as deliveries find no idle one, take the
deliveries endpoint by endpoint in turn, each endpoint only while it has room (its adaptive
limit, within its ``max_concurrency``) and its breaker lets it; a dead endpoint's deliveries
never hold the loops from a healthy one's. Each batch's
outcomes are written in one statement, fenced by the lease token, and shielded from cancellation.

``OutboxProcessor`` only composes the parts, in the order a message meets them:
``relay.lease`` (the run's loop) → ``relay.batch`` (plan) → ``relay.dispatch`` (the queues and
each endpoint's room) → ``relay.delivery`` (one attempt, the breaker and admission) →
``relay.classify`` (outcomes) → ``relay.record`` (the outcome write). docs/internals.md, "How a
message flows". Each part's performance special cases are noted at the top of the part. Beside
them ``relay.limit_store`` starts each endpoint's limit where the processes before this one left
it (before the first lease) and keeps what it learns (after a batch, at most every few seconds).

Fast path (docs/performance.md § "The relay's own CPU", its table of changes): a recorded batch
lets its deliveries go at once (``_run_batch``), not at a garbage collection ("a recorded batch
lets its deliveries go at once").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from outbox.core.clock import DatabaseClock
from outbox.core.errors import DatabaseError
from outbox.core.models import DrainSummary
from outbox.core.redact import Redactor
from outbox.core.settings import Settings
from outbox.core.telemetry import Telemetry, process_telemetry
from outbox.relay.admission import Admission, Slots
from outbox.relay.batch import Batch, Run, endpoint_names, finish, plan, targets_of
from outbox.relay.breaker_store import BreakerWriter
from outbox.relay.breakers import Key
from outbox.relay.classify import Classifier
from outbox.relay.delivery import Deliver, Deliverer
from outbox.relay.dispatch import Dispatch, EndpointSlots
from outbox.relay.lease import Leaser, max_waiting
from outbox.relay.limit_store import LimitKeeper
from outbox.relay.record import Recorder, report_error, shielded
from outbox.relay.stopping import StopSignal, stop_rule
from outbox.store.connection import Connection
from outbox.store.contract import RelayStore
from outbox.store.postgres import PostgresStore

__all__ = ["Deliver", "OutboxProcessor", "shielded"]


class OutboxProcessor:
    """Drains the outbox: shared by the queue, timer and HTTP triggers (and ``outbox serve``).

    ``store`` is what it leases from and records to: a ``RelayStore`` (the runtime's
    ``PostgresStore``; ``store.memory.MemoryStore`` in the loop's unit tests). A pool given in its
    place (the first argument before the store contract) is wrapped in a ``PostgresStore``."""

    def __init__(
        self,
        store: RelayStore | Connection,
        deliver: Deliver,
        settings: Settings,
        *,
        redact: Redactor | None = None,
        clock: DatabaseClock | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        relay_store = store if isinstance(store, RelayStore) else PostgresStore(store)
        self._store = relay_store
        self._settings = settings
        # Set at each lease, read by the publisher (webhook-timestamp) and for Retry-After dates.
        self.clock = clock or DatabaseClock()
        self._redact = redact or Redactor.from_settings(settings)
        self._hold = settings.ordering_on_failure == "hold"
        self._stop = StopSignal()
        self._endpoints = settings.endpoints
        self._targets = targets_of(self._endpoints, settings.http_timeout_seconds)
        caps = {t.key: t.endpoint.max_concurrency for ts in self._targets.values() for t in ts}
        self._endpoint_slots = EndpointSlots(settings.concurrency, caps)
        # Each endpoint's limit starts where the relays before this one learned it, and is kept.
        self._limits = LimitKeeper(relay_store, self._endpoint_slots.limits)
        # Spans and metrics: the API's no-ops unless an OpenTelemetry SDK is configured.
        self._telemetry = telemetry or process_telemetry()
        admission = Admission(settings.concurrency, max_waiting(settings))
        breakers = BreakerWriter(relay_store, self._other_endpoints)
        self._breakers = breakers
        classifier = Classifier(settings.max_attempts, self._endpoints, self._redact)
        self._leaser = Leaser(
            relay_store,
            settings,
            targets=self._targets,
            endpoints=self._endpoints,
            admission=admission,
            endpoint_slots=self._endpoint_slots,
            breakers=breakers.book,
            clock=self.clock,
            stop=self._stop,
            redact=self._redact,
        )
        self._delivery = Deliverer(
            deliver,
            slots=Slots(settings.concurrency),
            admission=admission,
            endpoint_slots=self._endpoint_slots,
            breakers=breakers,
            telemetry=self._telemetry,
            classifier=classifier,
            clock=self.clock,
            stop=self._stop,
        )
        self._recorder = Recorder(
            relay_store,
            hold_on_failure=self._hold,
            clock=self.clock,
            classifier=classifier,
            breakers=breakers,
            redact=self._redact,
        )
        self._admission = admission

    def stop(self) -> None:
        """Make running drains finish what is in flight, release the rest, and return."""
        self._stop.requested = True

    def more_due(self) -> None:
        """A wake-up hint came (``OUTBOX_WAKEUP=postgres``: a NOTIFY): a run waiting for its
        deliveries in flight after it caught up leases what was committed now, rather than once
        the receiver has answered them all."""
        self._leaser.more_due()

    async def close(self) -> None:
        """The process is done with this processor: what its endpoints' limits learned since the
        last write is kept (``relay.limit_store``)."""
        await self._limits.save(closing=True)

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
        run = Run(summary, started + budget, stop_rule(until_caught_up=until_caught_up))
        batches: set[asyncio.Task[None]] = set()
        delivery = self._delivery
        work = Dispatch(delivery.has_room, self._endpoint_slots, delivery.will_not_start)
        self._endpoint_slots.listeners.add(work)
        # Started as deliveries find no idle loop: a run of one message makes one loop.
        loops: list[asyncio.Task[None]] = []

        def spawn() -> None:
            if len(loops) < self._settings.concurrency:
                loops.append(asyncio.create_task(delivery.loop(work)))

        def start(batch: Batch) -> asyncio.Task[None]:
            return self._start(batch, work, batches, spawn)

        # A pause must stop what this run leased too, not only the next lease's messages.
        pauses = asyncio.create_task(self._breakers.watch_pauses())
        try:
            await self._limits.start()
            if run.rule.sweeps:
                await self._store.release_held(hold_on_failure=self._hold)
            await self._leaser.drain(run, batches, start)
        except DatabaseError as exc:
            report_error(summary, f"database error: {exc}", self._redact)
        except asyncio.CancelledError:
            # Interrupt the deliveries; each batch still records what it has (shielded).
            for task in (*batches, *loops):
                task.cancel()
            raise
        finally:
            try:
                await finish(batches, self._redact)
            finally:
                # Also when cancelled while the last batches finish: no loop outlives the run.
                for task in (*loops, pauses):
                    task.cancel()
                await asyncio.gather(*loops, pauses, return_exceptions=True)
                self._endpoint_slots.listeners.discard(work)
                work.clear()
                summary.duration_seconds = time.monotonic() - started
        return summary

    def _start(
        self,
        batch: Batch,
        work: Dispatch,
        batches: set[asyncio.Task[None]],
        spawn: Callable[[], None],
    ) -> asyncio.Task[None]:
        """Plan a leased batch's deliveries and hand them to the delivery loops; a task (returned)
        records its outcomes once they are done."""
        batch.run.summary.leased += len(batch.messages)
        batch.run.summary.batches += 1
        plan(batch, self._targets)
        # Counted as waiting by the lease, one per message: one per delivery from now on.
        self._admission.reserve(batch.remaining - len(batch.messages))
        for delivery in batch.all_deliveries():
            if not work.put(delivery):  # no idle loop took it: one more loop, up to the slots
                spawn()
        task = asyncio.create_task(self._run_batch(batch))
        batches.add(task)
        task.add_done_callback(batches.discard)
        return task

    async def _run_batch(self, batch: Batch) -> None:
        try:
            await asyncio.shield(batch.delivered)
        finally:
            # The drain may lease the next batch while this one writes its outcomes.
            if not batch.delivered.done():
                batch.delivered.set_result(None)
            # Also on cancellation: whatever finished is recorded, whatever was sent and did not
            # finish is retried, whatever was not sent is released (and will not be sent now).
            self._delivery.close(batch)
            try:
                await shielded(self._recorder.record(batch))
                await self._limits.save()  # at most every few seconds
            finally:
                # Its deliveries point back at it: let them all go now, with the last reference,
                # rather than wait for a garbage collection (batches would pile up meanwhile).
                batch.deliveries.clear()

    def _other_endpoints(self, key: Key) -> list[str]:
        event_type, name = key
        return [n for n in endpoint_names(self._endpoints, event_type) if n != name]
