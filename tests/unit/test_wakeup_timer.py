"""The time a process wants its next run (``WakeUps``), which ``outbox serve`` arms a timer on:
kept whether or not a hint could be sent, the earliest wins, and a run that starts takes it."""

from __future__ import annotations

import time

from outbox.core.settings import QueueSettings
from outbox.relay.wakeups import COVER_SLACK_SECONDS, WakeUps


def no_queue() -> WakeUps:
    return WakeUps(QueueSettings.load())


async def test_without_a_queue_a_later_run_is_still_wanted_at_its_time() -> None:
    wakeups = no_queue()
    assert wakeups.due_in(time.monotonic()) is None
    assert await wakeups.wake_in(30) is False  # no hint: there is no queue
    assert wakeups.changed.is_set()
    due_in = wakeups.due_in(time.monotonic())
    assert due_in is not None
    assert 0 < due_in <= 30
    assert wakeups.take_due(time.monotonic()) is False  # not yet
    assert wakeups.take_due(time.monotonic() + 31) is True
    assert wakeups.take_due(time.monotonic() + 31) is False  # told once


async def test_the_earliest_time_wins_and_a_later_one_changes_nothing() -> None:
    wakeups = no_queue()
    await wakeups.wake_in(60)
    await wakeups.wake_in(10)
    wakeups.changed.clear()
    await wakeups.wake_in(45)
    assert not wakeups.changed.is_set()
    due_in = wakeups.due_in(time.monotonic())
    assert due_in is not None
    assert due_in <= 10


async def test_a_run_that_starts_takes_what_was_due_by_then_but_not_later() -> None:
    wakeups = no_queue()
    await wakeups.wake_now()
    wakeups.run_starting(time.monotonic())
    assert wakeups.due_in(time.monotonic()) is None  # the timer will not drain again for it
    await wakeups.wake_in(20)
    wakeups.run_starting(time.monotonic())
    assert wakeups.due_in(time.monotonic()) is not None  # still wanted: due after this run
    wakeups.run_starting(time.monotonic() + 20 - COVER_SLACK_SECONDS)
    assert wakeups.due_in(time.monotonic()) is None
