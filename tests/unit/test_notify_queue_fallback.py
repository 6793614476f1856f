"""Wake-ups over PostgreSQL that cannot be relied on (``OUTBOX_WAKEUP=postgres``): the NOTIFY
queue's usage above the alert, or a NOTIFY of the relay's own that failed. Status reports the
first; both make the relay want a run every few seconds (it polls) until they are over. The
usage is given here; tests/reliability/test_notify_queue_full.py fills a real queue."""

from __future__ import annotations

import logging
import time

import pytest

from outbox.core.errors import DatabaseError
from outbox.core.models import DrainSummary
from outbox.core.settings import NOTIFY_QUEUE_ALERT_USAGE, QueueSettings
from outbox.operations.status import notify_queue_problem
from outbox.relay.wakeups import (
    FALLBACK_POLL_SECONDS,
    NOTIFY_FAILED_POLL_SECONDS,
    NOTIFY_QUEUE_LOG_INTERVAL_SECONDS,
    WakeUps,
)
from outbox.store.memory import MemoryStore


def over_postgres(store: MemoryStore) -> WakeUps:
    return WakeUps(QueueSettings.load(wakeup="postgres"), store)


def wants_a_poll(wakeups: WakeUps) -> bool:
    due_in = wakeups.due_in(time.monotonic())
    return due_in is not None and due_in <= FALLBACK_POLL_SECONDS


@pytest.mark.parametrize("usage", [0.0, 0.000001, 0.01, 0.3, NOTIFY_QUEUE_ALERT_USAGE])
def test_status_says_nothing_of_a_notify_queue_at_or_below_the_alert(usage: float) -> None:
    assert notify_queue_problem(usage) is None


@pytest.mark.parametrize(("usage", "shown"), [(0.51, "51%"), (0.93, "93%"), (1.0, "100%")])
def test_status_reports_a_notify_queue_above_the_alert(usage: float, shown: str) -> None:
    problem = notify_queue_problem(usage)
    assert problem is not None
    assert f"NOTIFY queue is {shown} full (threshold 50%)" in problem
    assert "idle in a transaction" in problem


async def test_a_high_notify_queue_makes_the_relay_poll_until_it_falls_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    wakeups = over_postgres(store)
    now = time.monotonic()
    with caplog.at_level(logging.INFO, logger="outbox.wakeups"):
        wakeups.notify_queue_read(0.02, now)  # a tiny usage: nothing changes
        assert not wakeups.polling(now)
        assert wakeups.due_in(now) is None
        wakeups.notify_queue_read(0.7, now)
        assert wakeups.polling(now)
        assert wants_a_poll(wakeups)
        # Each run while it is high wants the next one within the poll interval.
        wakeups.run_starting(time.monotonic() + FALLBACK_POLL_SECONDS)
        assert wakeups.due_in(time.monotonic()) is None
        await wakeups.after_run(store, DrainSummary())
        assert wants_a_poll(wakeups)
        # The warning: at once, then at most once a minute while it stays high.
        wakeups.notify_queue_read(0.8, now + 5)
        wakeups.notify_queue_read(1.0, now + NOTIFY_QUEUE_LOG_INTERVAL_SECONDS)
        wakeups.notify_queue_read(0.0, now + NOTIFY_QUEUE_LOG_INTERVAL_SECONDS + 5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "NOTIFY queue is 70% full (above 50%)" in warnings[0]
    assert "polling every 3 s" in warnings[0]
    assert "NOTIFY queue is 100% full" in warnings[1]
    assert "back to 0% full; waiting for wake-ups again" in caplog.records[-1].getMessage()
    # Back to waiting for wake-ups: a run wants no other run.
    assert not wakeups.polling(time.monotonic())
    wakeups.run_starting(time.monotonic() + FALLBACK_POLL_SECONDS)
    await wakeups.after_run(store, DrainSummary())
    assert wakeups.due_in(time.monotonic()) is None


async def test_a_failed_notify_of_the_relays_own_makes_it_poll_for_a_while() -> None:
    store = MemoryStore()
    wakeups = over_postgres(store)
    store.failing = DatabaseError(
        "too many notifications in the NOTIFY queue",
        transient=False,
        kind="ProgramLimitExceededError",
    )
    assert await wakeups.wake_now() is False
    store.failing = None
    failed = time.monotonic()
    assert wakeups.polling(failed)
    assert wants_a_poll(wakeups)
    for _ in range(2):  # each run while it lasts wants the next
        wakeups.run_starting(time.monotonic() + FALLBACK_POLL_SECONDS)
        assert wakeups.due_in(time.monotonic()) is None
        await wakeups.after_run(store, DrainSummary())
        assert wants_a_poll(wakeups)
    # Once the hold is over with nothing else wrong, wake-ups are trusted again.
    assert not wakeups.polling(failed + NOTIFY_FAILED_POLL_SECONDS)
    # A NOTIFY that goes through changes nothing by itself: the hold runs out.
    assert await wakeups.wake_now() is True
    assert wakeups.polling(time.monotonic())


async def test_with_wake_ups_working_a_run_wants_no_other() -> None:
    store = MemoryStore()
    wakeups = over_postgres(store)
    assert await wakeups.wake_now() is True
    wakeups.run_starting(time.monotonic())
    await wakeups.after_run(store, DrainSummary())
    assert not wakeups.polling(time.monotonic())
    assert wakeups.due_in(time.monotonic()) is None
