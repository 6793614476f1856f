"""How much a run may lease, from the process's waiting messages and its pace of requests."""

from __future__ import annotations

import asyncio

import pytest

from outbox.relay.admission import Admission, Slots


def test_before_any_request_finished_one_batch_is_leased_to_learn_the_pace() -> None:
    admission = Admission(concurrency=4)
    assert admission.room(within=10, batch_size=100) == 100
    admission.reserve(100)
    assert admission.room(within=10, batch_size=100) == 0  # nothing more until the pace is known


def test_a_run_leases_what_the_slots_can_start_in_time_less_what_waits() -> None:
    admission = Admission(concurrency=4)
    admission.finished(0.1)  # 40 requests a second
    assert admission.room(within=1.0, batch_size=100) == 40
    admission.reserve(30)
    assert admission.room(within=1.0, batch_size=100) == 10
    assert admission.room(within=0.5, batch_size=100) == 0
    admission.release(30)
    assert admission.room(within=100, batch_size=100) == 100  # never more than a batch


def test_the_pace_follows_the_requests_smoothly() -> None:
    admission = Admission(concurrency=1)
    admission.finished(1.0)
    for _ in range(30):
        admission.finished(0.01)
    assert admission.pace is not None
    assert 0.01 <= admission.pace < 0.02


async def test_slots_are_taken_at_once_while_free_then_handed_out_in_turn() -> None:
    slots = Slots(2)
    assert slots.take_now()
    assert slots.take_now()
    assert not slots.take_now()
    order: list[str] = []

    async def wait(name: str) -> None:
        await slots.take()
        order.append(name)

    first = asyncio.create_task(wait("first"))
    second = asyncio.create_task(wait("second"))
    await asyncio.sleep(0)
    assert order == []
    slots.give_back()
    await asyncio.sleep(0)
    assert order == ["first"]
    # A free slot is not taken at once while someone waits for one.
    assert not slots.take_now()
    slots.give_back()
    await asyncio.gather(first, second)
    assert order == ["first", "second"]


async def test_a_waiter_cancelled_before_or_after_being_handed_a_slot_loses_none() -> None:
    slots = Slots(1)
    assert slots.take_now()
    gone = asyncio.create_task(slots.take())
    handed = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    gone.cancel()  # still waiting: it leaves the line
    slots.give_back()  # the slot goes to the next in line...
    handed.cancel()  # ...which is cancelled before it runs: it passes the slot on
    for task in (gone, handed):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert slots.take_now()
    assert not slots.take_now()
