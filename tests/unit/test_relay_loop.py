"""The relay's loop over ``MemoryStore``: its end conditions, stop rules, breakers and admission,
without PostgreSQL, HTTP or sleeps. A fake publisher answers in-process; the store's clock is moved
by the test (``Clock``). tests/contract shows the memory store keeps the SQL's rules."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from outbox.core.errors import DatabaseError
from outbox.core.models import DeliveryResult, LeasedMessage, Response, TransportError
from outbox.core.settings import Settings, WebhookEndpoint
from outbox.relay.breakers import COOL_DOWN_SECONDS, THRESHOLD
from outbox.relay.processor import OutboxProcessor
from outbox.store.memory import MemoryStore
from outbox.store.postgres import PostgresStore

URL = "https://receiver.example/hooks"


class Clock:
    """The store's clock: seconds since the epoch, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Receiver:
    """An in-process publisher: ``answer`` says what each request gets; it counts what it was
    sent, and how many requests were in flight at once (each yields once to the loop)."""

    def __init__(self, answer: Callable[[LeasedMessage, str], DeliveryResult] | None = None):
        self.answer = answer or (lambda _m, _e: Response(200))
        self.sent: list[tuple[str, str]] = []  # (message's event type, endpoint), in order
        self.order: list[Any] = []  # message ids, in the order sent
        self.in_flight: Counter[str] = Counter()
        self.most: Counter[str] = Counter()  # per endpoint, and "" for all of them
        self.on_send: Callable[[], None] | None = None

    async def deliver(self, message: LeasedMessage, endpoint: WebhookEndpoint) -> DeliveryResult:
        name = endpoint.name or ""
        self.sent.append((message.event_type, name))
        self.order.append(message.message_id)
        if self.on_send is not None:
            self.on_send()
        for key in (name, ""):
            self.in_flight[key] += 1
            self.most[key] = max(self.most[key], self.in_flight[key])
        try:
            await asyncio.sleep(0)  # a yield, not a wait: the other loops run meanwhile
            return self.answer(message, name)
        finally:
            for key in (name, ""):
                self.in_flight[key] -= 1


class Held:
    """A publisher whose answers wait until ``release``; it counts the requests in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.sent = 0
        self.released = asyncio.Event()

    async def deliver(self, message: LeasedMessage, endpoint: WebhookEndpoint) -> DeliveryResult:
        self.in_flight += 1
        self.sent += 1
        try:
            await self.released.wait()
            return Response(204)
        finally:
            self.in_flight -= 1

    async def reaches(self, count: int) -> None:
        """Until ``count`` requests are in flight at once (a deadline, never a sleep's time)."""
        deadline = time.monotonic() + 10
        while self.in_flight < count:
            assert time.monotonic() < deadline, f"{self.in_flight} in flight, not {count}"
            await asyncio.sleep(0.01)


def settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": "postgresql://relay@127.0.0.1:5432/outbox",
        "webhooks": {"OrderCompleted": {"url": URL}},
        "batch_size": 100,
        "concurrency": 4,
        "http_timeout_seconds": 5,
        "lease_seconds": 60,
    }
    values.update(overrides)
    return Settings.load(**values)


def relay(
    receiver: Receiver, clock: Clock | None = None, **overrides: Any
) -> tuple[OutboxProcessor, MemoryStore]:
    memory = MemoryStore(clock=clock or Clock())
    processor = OutboxProcessor(memory, receiver.deliver, settings(**overrides))
    return processor, memory


def statuses(memory: MemoryStore) -> Counter[str]:
    return Counter(row.status for row in memory.messages.values())


async def test_a_drain_delivers_everything_due_and_ends_on_a_lease_that_finds_nothing() -> None:
    receiver = Receiver()
    processor, memory = relay(receiver)
    for _ in range(250):
        memory.add("OrderCompleted")
    summary = await processor.execute()
    assert (summary.processed, summary.batches, summary.stopped_by) == (250, 3, "drained")
    assert statuses(memory) == {"Processed": 250}
    assert len(receiver.sent) == 250
    # It reads the learned limits first, lets go what was parked (a drain sweeps), and its last
    # lease found nothing.
    assert memory.calls[:2] == ["start_limits", "release_held"]
    assert memory.calls[-1] == "lease_batch"
    assert memory.calls.count("lease_batch") == 4


async def test_a_hint_s_run_stops_once_caught_up_without_a_lease_more() -> None:
    processor, memory = relay(Receiver())
    for _ in range(5):
        memory.add("OrderCompleted")
    summary = await processor.execute(until_caught_up=True)
    assert summary.processed == 5
    # Its first answers make the endpoint's learned limit worth keeping (relay.limit_store).
    assert memory.calls == ["start_limits", "lease_batch", "record_delivered", "save_limits"]


async def test_a_hint_leases_what_was_committed_without_waiting_for_the_answers_in_flight() -> None:
    held = Held()
    memory = MemoryStore()
    processor = OutboxProcessor(memory, held.deliver, settings(concurrency=8))
    memory.add("OrderCompleted")
    run = asyncio.create_task(processor.execute(until_caught_up=True))
    await held.reaches(1)  # caught up, its one request unanswered
    for count in range(2, 9):  # each committed, then its hint (OUTBOX_WAKEUP=postgres)
        memory.add("OrderCompleted")
        processor.more_due()
        await held.reaches(count)  # sent while the earlier ones still wait for their answers
    assert memory.calls.count("lease_batch") == 8  # a batch of one each: none waited
    held.released.set()
    summary = await run
    assert (summary.processed, summary.batches) == (8, 8)


async def test_without_a_hint_a_caught_up_run_waits_for_its_answers_and_ends() -> None:
    held = Held()
    memory = MemoryStore()
    processor = OutboxProcessor(memory, held.deliver, settings())
    memory.add("OrderCompleted")
    run = asyncio.create_task(processor.execute(until_caught_up=True))
    await held.reaches(1)
    memory.add("OrderCompleted")  # committed without a hint: the next run's
    held.released.set()
    assert (await run).processed == 1
    assert held.sent == 1


async def test_a_hint_s_run_leases_again_for_the_next_message_of_a_key_it_let_go() -> None:
    receiver = Receiver()
    processor, memory = relay(receiver)
    first = memory.add("OrderCompleted", ordering_key="customer-1")
    second = memory.add("OrderCompleted", ordering_key="customer-1")
    third = memory.add("OrderCompleted", ordering_key="customer-1")
    summary = await processor.execute(until_caught_up=True)
    assert summary.processed == 3
    assert receiver.order == [first, second, third]
    # One lease per message: each let the next go (the third was parked behind the second).
    assert memory.calls.count("lease_batch") == 3
    assert "release_held" not in memory.calls


async def test_a_drain_ends_with_retries_not_yet_due_and_the_next_run_takes_them() -> None:
    clock = Clock()
    receiver = Receiver(lambda _m, _e: Response(503))
    processor, memory = relay(receiver, clock)
    for _ in range(3):
        memory.add("OrderCompleted")
    summary = await processor.execute()
    assert (summary.retried, summary.processed, summary.stopped_by) == (3, 0, "drained")
    due_in = await memory.next_due_in()
    assert due_in is not None
    assert due_in > 0
    assert (await processor.execute()).leased == 0  # nothing due yet
    receiver.answer = lambda _m, _e: Response(200)
    clock.advance(due_in * 2)
    summary = await processor.execute()
    assert summary.processed == 3
    assert {row.attempt_count for row in memory.messages.values()} == {2}


async def test_stop_finishes_what_is_in_flight_and_gives_the_rest_back() -> None:
    receiver = Receiver()
    processor, memory = relay(receiver, concurrency=1)
    for _ in range(10):
        memory.add("OrderCompleted")
    receiver.on_send = processor.stop
    summary = await processor.execute()
    assert summary.stopped_by == "stopped"
    assert (summary.processed, summary.released) == (1, 9)
    assert statuses(memory) == {"Processed": 1, "Pending": 9}
    # Given back as they were: the attempt is not counted.
    pending = [row for row in memory.messages.values() if row.status == "Pending"]
    assert {row.attempt_count for row in pending} == {0}


async def test_a_spent_budget_leases_nothing() -> None:
    processor, memory = relay(Receiver())
    memory.add("OrderCompleted")
    summary = await processor.execute(budget_seconds=1e-9)
    assert (summary.stopped_by, summary.leased) == ("budget", 0)
    assert "lease_batch" not in memory.calls


async def test_a_database_error_ends_the_run_in_its_summary_not_raised() -> None:
    processor, memory = relay(Receiver())
    memory.add("OrderCompleted")
    memory.failing = DatabaseError("ConnectionRefusedError: gone", transient=True, kind="X")
    summary = await processor.execute()
    assert summary.stopped_by == "error"
    assert summary.error is not None
    assert "database error" in summary.error


async def test_a_breaker_opens_after_threshold_failures_and_a_probe_closes_it() -> None:
    clock = Clock()
    receiver = Receiver(lambda _m, _e: TransportError("refused", "ConnectionRefusedError"))
    processor, memory = relay(receiver, clock, concurrency=1)
    for _ in range(THRESHOLD * 2):
        memory.add("OrderCompleted")
    summary = await processor.execute()
    # The THRESHOLD-th failure opened it here at once: the rest were not sent, nor counted.
    assert len(receiver.sent) == THRESHOLD
    assert (summary.retried, summary.released) == (THRESHOLD, THRESHOLD)
    breaker = memory.endpoints[("OrderCompleted", "OrderCompleted")]
    assert (breaker.failures, breaker.opens) == (THRESHOLD, 1)
    assert breaker.reopen_at == clock.now + COOL_DOWN_SECONDS[0]
    # Every message waits for its cool-down (pushed, or backing off past it).
    assert await memory.next_due_in() is not None
    assert (await processor.execute()).leased == 0
    # The cool-down and the retries' delays pass: one probe, answered, closes it.
    receiver.answer = lambda _m, _e: Response(200)
    clock.advance(COOL_DOWN_SECONDS[1])
    summary = await processor.execute()
    assert summary.processed == THRESHOLD * 2
    assert memory.calls.count("claim_probe") == 1
    assert memory.endpoints == {}


async def test_a_failed_probe_opens_the_breaker_again_for_twice_as_long() -> None:
    clock = Clock()
    receiver = Receiver(lambda _m, _e: Response(503))
    processor, memory = relay(receiver, clock, concurrency=1)
    for _ in range(THRESHOLD + 5):
        memory.add("OrderCompleted")
    await processor.execute()
    clock.advance(COOL_DOWN_SECONDS[1])
    sent_before = len(receiver.sent)
    await processor.execute()
    assert len(receiver.sent) == sent_before + 1  # the probe only
    breaker = memory.endpoints[("OrderCompleted", "OrderCompleted")]
    assert breaker.opens == 2
    assert breaker.reopen_at == clock.now + 2 * COOL_DOWN_SECONDS[0]


async def test_a_dead_endpoint_s_breaker_leaves_the_healthy_endpoint_of_its_event_type() -> None:
    webhooks = {
        "OrderCompleted": [
            {"url": URL, "name": "dead"},
            {"url": URL, "name": "healthy"},
        ]
    }
    receiver = Receiver(
        lambda _m, name: TransportError("refused") if name == "dead" else Response(200)
    )
    processor, memory = relay(receiver, webhooks=webhooks, concurrency=1)
    for _ in range(THRESHOLD * 2):
        memory.add("OrderCompleted")
    await processor.execute()
    sent = Counter(name for _, name in receiver.sent)
    assert sent == {"dead": THRESHOLD, "healthy": THRESHOLD * 2}
    assert memory.endpoints[("OrderCompleted", "dead")].opens == 1
    assert all(
        '"healthy": {"status": "Processed"' in (row.endpoint_state or "")
        for row in memory.messages.values()
    )


async def test_requests_in_flight_never_exceed_the_slots_nor_an_endpoint_s_cap() -> None:
    webhooks = {
        "OrderCompleted": {"url": URL, "max_concurrency": 1},
        "Unsigned": {"url": URL},
    }
    receiver = Receiver()
    processor, memory = relay(receiver, webhooks=webhooks, concurrency=3)
    for _ in range(60):
        memory.add("OrderCompleted")
        memory.add("Unsigned")
    summary = await processor.execute()
    assert summary.processed == 120
    assert receiver.most[""] == 3  # every slot used, never more
    assert receiver.most["OrderCompleted"] == 1
    assert receiver.most["Unsigned"] == 2


async def test_the_first_lease_takes_one_batch_to_learn_the_pace() -> None:
    sizes: list[int] = []
    receiver = Receiver()
    processor, memory = relay(receiver, batch_size=50)
    lease = memory.lease_batch

    async def recording(batch_size: int, lease_seconds: float, **kwargs: Any) -> Any:
        sizes.append(batch_size)
        return await lease(batch_size, lease_seconds, **kwargs)

    memory.lease_batch = recording  # type: ignore[method-assign]
    for _ in range(120):
        memory.add("OrderCompleted")
    summary = await processor.execute()
    assert summary.processed == 120
    assert sizes[0] == 50
    assert all(size <= 50 for size in sizes)


async def test_a_message_leased_by_a_relay_that_died_waits_for_its_lease_to_expire() -> None:
    clock = Clock()
    processor, memory = relay(Receiver(), clock)
    message_id = memory.add("OrderCompleted")
    await memory.lease_batch(10, 60)  # another relay leases it, then dies
    assert (await processor.execute()).leased == 0
    clock.advance(61)
    summary = await processor.execute()
    assert summary.processed == 1
    assert memory.messages[message_id].attempt_count == 2


async def test_a_wake_up_the_store_cannot_send_is_no_error() -> None:
    memory = MemoryStore()
    memory.failing = DatabaseError("ConnectionRefusedError: gone", transient=True, kind="X")
    assert await memory.notify_wakeup() is False
    memory.failing = None
    assert await memory.notify_wakeup() is True
    assert memory.wakeups_sent == 1


def test_a_pool_given_for_the_store_is_wrapped_in_the_postgres_store() -> None:
    # OutboxProcessor(pool, deliver, settings), as before the store contract, still works.
    pool = object()
    processor = OutboxProcessor(pool, Receiver().deliver, settings())
    assert isinstance(processor._store, PostgresStore)
    assert processor._store.pool is pool
    memory = MemoryStore()
    assert OutboxProcessor(memory, Receiver().deliver, settings())._store is memory
