"""Learned limits that outlive the process: where a new process starts each endpoint's limit
(``outbox.relay.learned``, pure) and how often a process writes what it learned
(``outbox.relay.limit_store``, over ``MemoryStore`` on a clock the test moves)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from outbox.core.models import Response
from outbox.relay.dispatch import EndpointSlots
from outbox.relay.learned import (
    HALF_LIFE_SECONDS,
    LIVE_SECONDS,
    RECENT_SECONDS,
    Start,
    aged,
    start,
)
from outbox.relay.limit_store import REFRESH_SECONDS, WRITE_SECONDS, LimitKeeper
from outbox.relay.limits import INITIAL_LIMIT, AdaptiveLimit
from outbox.relay.processor import OutboxProcessor
from outbox.store.contract import LearnedLimit, OwnLimit
from outbox.store.memory import MemoryStore
from tests.unit.test_relay_loop import Clock, Held, Receiver, relay, settings

KEY = ("OrderCompleted", "orders")
OK, BUSY = Response(204), Response(503)


def row(
    concurrency: float,
    *,
    age: float = 0.0,
    settled: float | None = None,
    pushed_back_ago: float | None = None,
    learned: bool = True,
) -> LearnedLimit:
    return LearnedLimit(*KEY, concurrency, settled, age, pushed_back_ago, learned)


# Where a new process starts (relay.learned).


def test_an_endpoint_nothing_was_learned_of_starts_as_before() -> None:
    assert start([], 1024) is None
    assert start([row(100, learned=False)], 1024) is None  # another relay's start only


def test_it_starts_from_what_the_endpoint_last_accepted_within_its_ceiling() -> None:
    latest = start([row(500, age=900), row(200, age=600)], 1024)
    assert latest == Start(aged(200, 600), pushed_back=False)
    assert start([row(500)], 128) == Start(128, pushed_back=False)  # max_concurrency, slots
    assert start([row(0.5)], 1024) == Start(1, pushed_back=False)


def test_an_old_limit_counts_less_and_a_low_one_is_never_raised() -> None:
    hour = HALF_LIFE_SECONDS
    assert start([row(216, age=hour)], 1024) == Start(INITIAL_LIMIT + 100, pushed_back=False)
    assert start([row(216, age=2 * hour)], 1024) == Start(INITIAL_LIMIT + 50, pushed_back=False)
    assert start([row(216, age=48 * hour)], 1024).limit < INITIAL_LIMIT + 0.01  # type: ignore[union-attr]
    assert start([row(4, age=48 * hour)], 1024) == Start(4, pushed_back=False)


def test_after_a_recent_push_back_it_starts_where_it_settled_not_at_its_peak() -> None:
    gone = row(180, settled=100, pushed_back_ago=200, age=200)  # its process ended
    assert start([gone], 1024) == Start(aged(100, 200), pushed_back=True)
    long_ago = row(180, settled=100, pushed_back_ago=2 * RECENT_SECONDS, age=60)
    assert start([long_ago], 1024) == Start(aged(180, 60), pushed_back=False)


def test_relays_started_at_once_share_what_an_endpoint_that_pushed_back_accepted() -> None:
    # One relay learned it (gone ten minutes); four start at once, one after another in the
    # store's lock, each reading the starts of those before it.
    rows = [row(130, settled=100, pushed_back_ago=700, age=600)]
    starts = []
    for _ in range(4):
        begun = start(rows, 1024)
        assert begun is not None
        assert begun.pushed_back
        starts.append(begun.limit)
        rows.append(row(begun.limit, learned=False))
    assert starts[0] == start(rows[:1], 1024).limit  # type: ignore[union-attr]
    assert starts[1:] == [INITIAL_LIMIT] * 3
    assert sum(starts) < 100 + 4 * INITIAL_LIMIT  # not four times what it accepted


def test_a_relay_joining_those_that_share_a_full_endpoint_starts_small() -> None:
    live = [row(66, settled=50, pushed_back_ago=5, age=age) for age in (1, 20, 40)]
    assert start(live, 1024) == Start(INITIAL_LIMIT, pushed_back=True)
    gone = [row(66, settled=50, pushed_back_ago=200, age=LIVE_SECONDS + 1)]
    # Nobody delivers to it now: it starts where the last one settled.
    assert start(gone, 1024) == Start(aged(50, LIVE_SECONDS + 1), pushed_back=True)


# The limit itself (relay.limits).


def test_a_resumed_limit_grows_by_one_per_round_trip_after_a_push_back() -> None:
    limit = AdaptiveLimit(1024)
    limit.resume(100, pushed_back=True)
    for _ in range(100):  # one round trip's answers
        limit.answered(OK, 0.1, 0.0)
    assert 100.9 < limit.limit < 101.1
    doubling = AdaptiveLimit(1024)
    doubling.resume(100, pushed_back=False)
    for _ in range(100):
        doubling.answered(OK, 0.1, 0.0)
    assert doubling.limit == 200
    bounded = AdaptiveLimit(64)
    bounded.resume(500, pushed_back=False)
    assert bounded.limit == 64


def test_an_overload_records_where_it_left_the_limit_and_when() -> None:
    limit = AdaptiveLimit(1024)
    limit.answered(OK, 0.1, 1.0)
    limit.answered(BUSY, 0.1, 2.0)
    assert (limit.settled, limit.pushed_back_at, limit.answers) == (8.5, 2.0, 2)


# What a process writes (relay.limit_store).


def keeper(
    memory: MemoryStore, clock: Clock, ceiling: int = 1024
) -> tuple[LimitKeeper, EndpointSlots]:
    slots = EndpointSlots(ceiling, {KEY: None})
    return LimitKeeper(memory, slots.limits, clock), slots


async def test_a_process_writes_its_limits_at_most_once_per_interval_whatever_the_answers() -> None:
    clock, memory = Clock(), MemoryStore()
    limits, slots = keeper(memory, clock)
    await limits.start()
    for answer in range(2000):  # 200 s of answers, every seventh pushing back
        clock.advance(0.1)
        slots.answered(KEY, BUSY if answer % 7 == 0 else OK, 0.1, clock())
        await limits.save()
    writes = memory.calls.count("save_limits")
    assert 200 / WRITE_SECONDS / 2 <= writes <= 200 / WRITE_SECONDS + 1
    (own,) = memory.limits.values()
    assert own.learned
    assert own.settled is not None
    assert own.pushed_back_at is not None


async def test_a_steady_limit_is_written_only_to_stay_counted_among_those_delivering() -> None:
    clock, memory = Clock(), MemoryStore()
    limits, slots = keeper(memory, clock, ceiling=32)
    for _ in range(3000):  # 300 s at its ceiling
        clock.advance(0.1)
        slots.answered(KEY, OK, 0.1, clock())
        await limits.save()
    clock.advance(REFRESH_SECONDS)
    await limits.save()  # the answers since its last write
    writes = memory.calls.count("save_limits")
    assert 300 / REFRESH_SECONDS <= writes <= 300 / REFRESH_SECONDS + 2
    for _ in range(100):  # no answer: nothing new to write, however long
        clock.advance(10)
        await limits.save()
    assert memory.calls.count("save_limits") == writes


async def test_a_limit_that_grew_while_fewer_were_sent_is_kept_as_what_was_served() -> None:
    clock, memory = Clock(), MemoryStore()
    limits, slots = keeper(memory, clock)
    for _ in range(200):  # a limit grows with each answer, however few were in flight
        slots.limits[KEY].answered(OK, 0.1, 0.0, in_flight=30)
    assert slots.limits[KEY].limit > 200
    await limits.save()
    assert next(iter(memory.limits.values())).concurrency == 30
    for _ in range(10):  # since that write: fewer than a new process would start with anyway
        slots.limits[KEY].answered(OK, 0.1, 0.0, in_flight=3)
    clock.advance(REFRESH_SECONDS)
    await limits.save()
    assert next(iter(memory.limits.values())).concurrency == INITIAL_LIMIT


async def test_closing_writes_what_changed_since_the_last_write() -> None:
    clock, memory = Clock(), MemoryStore()
    limits, slots = keeper(memory, clock)
    slots.answered(KEY, OK, 0.1, clock())
    await limits.save()
    for _ in range(40):
        slots.answered(KEY, OK, 0.1, clock())
    await limits.save()  # within the interval: not written
    assert next(iter(memory.limits.values())).concurrency == INITIAL_LIMIT + 1
    await limits.save(closing=True)
    assert next(iter(memory.limits.values())).concurrency == INITIAL_LIMIT + 41


async def test_a_new_process_starts_from_the_last_one_s_limit() -> None:
    memory = MemoryStore(clock=time.time)
    before = uuid.uuid4()
    await memory.save_limits(before, [OwnLimit(*KEY, 300.0, None, None, learned=True)])
    limits, slots = keeper(memory, Clock())
    await limits.start()
    assert slots.limits[KEY].limit == pytest.approx(300)  # aged by the instants since
    assert memory.limits[(KEY, limits.relay)].learned is False  # its start, kept
    # An endpoint that learned something before the start (a run began meanwhile) keeps it.
    again, other = keeper(memory, Clock())
    other.answered(KEY, OK, 0.1, 0.0)
    await again.start()
    assert other.limits[KEY].limit == INITIAL_LIMIT + 1


async def test_a_fresh_processor_sends_as_many_at_once_as_the_last_process_learned() -> None:
    held = Held()
    memory = MemoryStore(clock=time.time)
    processor = OutboxProcessor(memory, held.deliver, settings(concurrency=256))
    learned = OwnLimit("OrderCompleted", "OrderCompleted", 48.0, None, None, learned=True)
    await memory.save_limits(uuid.uuid4(), [learned])
    for _ in range(100):
        memory.add("OrderCompleted")
    drain = asyncio.create_task(processor.execute())
    await held.reaches(48)  # from 16, it could not grow without an answer
    assert held.in_flight == 48
    held.released.set()
    assert (await drain).processed == 100


async def test_a_drain_writes_its_limits_a_bounded_number_of_times() -> None:
    receiver = Receiver(
        lambda message, _: BUSY
        if message.attempt == 1 and hash(message.message_id) % 7 == 0
        else OK
    )
    processor, memory = relay(receiver, batch_size=10, concurrency=64)
    for _ in range(2000):
        memory.add("OrderCompleted")
    started = time.monotonic()
    summary = await processor.execute()
    elapsed = time.monotonic() - started
    await processor.close()
    assert summary.batches >= 200
    writes = memory.calls.count("save_limits")
    # One at most per interval, whatever the number of batches and push-backs, and one at close.
    assert 1 <= writes <= 2 + elapsed // WRITE_SECONDS
