"""Plan: a run, its leased batches, and each message's deliveries (one per endpoint still owed it).

A leased message becomes one ``Delivery`` per endpoint of its event type that has not answered
it yet (``plan``); the batch resolves ``delivered`` once every delivery has an attempt, and its
outcomes are then written (``relay.record``).

Fast paths (docs/performance.md § "The relay's own CPU", its table of changes):
- ``Target``: each endpoint's key and timeout are computed once per processor, not per delivery
  ("each endpoint's key and timeout computed once").
- ``Delivery`` is a plain class with ``__slots__``: one is made per message and endpoint, and it
  is the cheapest object to make.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from outbox.core.errors import describe
from outbox.core.models import Attempt, DrainSummary, LeasedMessage, Status, Undeliverable
from outbox.core.redact import Redactor
from outbox.core.settings import WebhookEndpoint
from outbox.relay.breakers import Key
from outbox.relay.stopping import StopRule

logger = logging.getLogger("outbox.processor")

Targets = Mapping[str, tuple["Target", ...]]  # per event type, its endpoints


@dataclass(eq=False)
class Run:
    """One ``execute()``: its summary, the end of its budget, and the rule that decides its end."""

    summary: DrainSummary
    # Monotonic: no lease and no delivery starts later.
    deadline: float
    rule: StopRule


class Target(NamedTuple):
    """An endpoint of an event type, as every delivery to it needs it."""

    endpoint: WebhookEndpoint
    key: Key  # (event type, endpoint name)
    timeout: float  # seconds one request to it may take


def targets_of(
    endpoints: Mapping[str, Sequence[WebhookEndpoint]], http_timeout_seconds: float
) -> dict[str, tuple[Target, ...]]:
    """Each event type's endpoints as deliveries need them, computed once."""
    return {
        event_type: tuple(
            Target(e, (event_type, endpoint_name(e)), e.timeout(http_timeout_seconds))
            for e in group
        )
        for event_type, group in endpoints.items()
    }


class Delivery:
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

    def __init__(self, batch: Batch, index: int, target: Target, number: int) -> None:
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
class Batch:
    """One leased batch while its deliveries are made by the run's delivery loops."""

    messages: list[LeasedMessage]
    lease_deadline: float
    run: Run
    # Resolved when every delivery has an attempt (or the batch is abandoned on cancellation).
    delivered: asyncio.Future[None]
    # Per message: its deliveries (one per endpoint still waiting), or why it has none.
    deliveries: list[list[Delivery] | Undeliverable] = field(default_factory=list)
    remaining: int = 0
    # Set once its outcomes are being written: a delivery not yet started is not made any more.
    closed: bool = field(default=False, init=False)

    def all_deliveries(self) -> list[Delivery]:
        return [d for planned in self.deliveries if isinstance(planned, list) for d in planned]

    def settle(self, delivery: Delivery, attempt: Attempt | BaseException | None) -> None:
        if attempt is not None:
            delivery.attempt = attempt
        self.remaining -= 1
        if self.remaining <= 0 and not self.delivered.done():
            self.delivered.set_result(None)


def plan(batch: Batch, targets: Targets) -> None:
    """Each message's deliveries: one per endpoint of its event type still waiting for it."""
    for index, message in enumerate(batch.messages):
        found = targets.get(message.event_type)
        if not found:
            batch.deliveries.append(
                Undeliverable(
                    f"no endpoint configured for event type {message.event_type!r} "
                    "(OUTBOX_WEBHOOKS)"
                )
            )
            continue
        if message.endpoint_state is None:  # every endpoint tried at each lease so far
            number = message.attempt
            batch.deliveries.append([Delivery(batch, index, t, number) for t in found])
            continue
        batch.deliveries.append(
            [
                Delivery(batch, index, t, _next_attempt(message, t.key[1]))
                for t in found
                if _waits(message, t.key[1])
            ]
        )
    batch.remaining = len(batch.all_deliveries())
    if not batch.remaining:
        batch.delivered.set_result(None)


async def finish(tasks: set[asyncio.Task[None]], redact: Redactor) -> None:
    """Wait for every batch task in ``tasks``; their errors are logged (redacted), not raised."""
    while tasks:
        snapshot = list(tasks)
        results = await asyncio.gather(*snapshot, return_exceptions=True)
        for result in results:
            _failed(result, redact)
        tasks.difference_update(snapshot)


async def finish_unless(
    tasks: set[asyncio.Task[None]], redact: Redactor, woken: asyncio.Future[None]
) -> bool:
    """``finish``, unless ``woken`` is done first: whether every task in ``tasks`` finished.
    Those still running when ``woken`` is done run on (nothing is cancelled here)."""
    while tasks and not woken.done():
        waits: set[asyncio.Future[None]] = {*tasks, woken}
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {woken}:
            tasks.discard(task)
            _failed(None if task.cancelled() else task.exception(), redact)
    return not tasks


def _failed(result: object, redact: Redactor) -> None:
    """Log a batch task's error (redacted), if ``result`` is one."""
    if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
        logger.error("outbox batch failed: %s", redact(describe(result)))


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


def endpoint_name(endpoint: WebhookEndpoint) -> str:
    assert endpoint.name is not None  # named by Settings
    return endpoint.name


def endpoint_names(
    endpoints: Mapping[str, Sequence[WebhookEndpoint]], event_type: str
) -> list[str]:
    """The names of ``event_type``'s endpoints, in their configured order."""
    return [endpoint_name(e) for e in endpoints.get(event_type, ())]
