"""After a run the relay asks when the next Pending message comes due (``next_due_in``), so that
a retry is woken on time; after a run that set no due time to come the answer from before stands
for up to ``NEXT_DUE_REFRESH_SECONDS`` while the run it wanted is still wanted, and is asked again
otherwise. A clock of the test's own stands in for the module's ``time``."""

from __future__ import annotations

import types
from typing import cast

import pytest

import outbox.relay.wakeups as wakeups_module
from outbox.core.errors import DatabaseError
from outbox.core.models import DrainSummary
from outbox.core.settings import QueueSettings
from outbox.relay.wakeups import COVER_SLACK_SECONDS, NEXT_DUE_REFRESH_SECONDS, WakeUps
from outbox.store.contract import RelayStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Answers:
    """``next_due_in`` as the database would answer it; how often it was asked."""

    def __init__(self, due_in: float | None) -> None:
        self.due_in = due_in
        self.asked = 0
        self.fails = False

    async def next_due_in(self) -> float | None:
        self.asked += 1
        if self.fails:
            raise DatabaseError("unavailable", transient=True, kind="ConnectionRefusedError")
        return self.due_in


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(wakeups_module, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    return clock


CLEAN = DrainSummary(leased=3, processed=3)


async def run(wakeups: WakeUps, answers: Answers, clock: Clock, summary: DrainSummary) -> None:
    wakeups.run_starting(clock.now)
    await wakeups.after_run(cast(RelayStore, answers), summary)


async def armed(clock: Clock, due_in: float) -> tuple[WakeUps, Answers, float]:
    """A process that ran once and was told the next message comes due in ``due_in`` seconds;
    the seconds until the run it then wants."""
    wakeups, answers = WakeUps(QueueSettings.load()), Answers(due_in)
    await run(wakeups, answers, clock, CLEAN)
    wanted = wakeups.due_in(clock.now)
    assert wanted is not None
    return wakeups, answers, wanted


async def test_clean_runs_within_a_second_ask_once_then_again(clock: Clock) -> None:
    wakeups, answers = WakeUps(QueueSettings.load()), Answers(None)
    for _ in range(5):
        await run(wakeups, answers, clock, CLEAN)
        clock.now += NEXT_DUE_REFRESH_SECONDS / 10
    assert answers.asked == 1
    clock.now += NEXT_DUE_REFRESH_SECONDS
    await run(wakeups, answers, clock, CLEAN)
    assert answers.asked == 2  # another process's retries are seen within a second of runs


@pytest.mark.parametrize(
    "summary",
    [
        DrainSummary(leased=2, processed=1, retried=1),
        DrainSummary(leased=2, processed=1, released=1, stopped_by="budget"),
        DrainSummary(leased=2, stopped_by="error", error="database"),
    ],
    ids=["retried", "gave back", "database error"],
)
async def test_a_run_that_may_have_set_a_time_asks_at_once(
    clock: Clock, summary: DrainSummary
) -> None:
    wakeups, answers = WakeUps(QueueSettings.load()), Answers(None)
    await run(wakeups, answers, clock, CLEAN)
    await run(wakeups, answers, clock, summary)
    if summary.stopped_by == "error":
        assert answers.asked == 1  # it wakes a run in 30 s instead: no answer to trust
        await run(wakeups, answers, clock, CLEAN)
    assert answers.asked == 2


async def test_a_known_retry_keeps_its_timer_and_is_asked_again_once_it_is_taken(
    clock: Clock,
) -> None:
    wakeups, answers, wanted = await armed(clock, 20.0)
    assert 20 <= wanted <= 24  # the retry's time, less its jitter
    clock.now += 0.5
    await run(wakeups, answers, clock, CLEAN)
    assert answers.asked == 1
    assert wakeups.due_in(clock.now) == pytest.approx(wanted - 0.5)  # still armed
    # The timer fires: the run takes it, and the next due time is asked for again.
    clock.now += wanted
    assert wakeups.take_due(clock.now)
    answers.due_in = 40.0
    await run(wakeups, answers, clock, CLEAN)
    assert answers.asked == 2
    assert wakeups.due_in(clock.now) is not None


async def test_a_run_that_took_the_timer_before_its_message_was_due_asks_again(
    clock: Clock,
) -> None:
    wakeups, answers, wanted = await armed(clock, 5.0)
    # A NOTIFY wakes a run just before the timer: it covers the timer's time, not the message.
    clock.now += NEXT_DUE_REFRESH_SECONDS / 2
    wakeups.run_starting(clock.now + wanted - COVER_SLACK_SECONDS)
    assert wakeups.due_in(clock.now) is None
    await wakeups.after_run(cast(RelayStore, answers), CLEAN)
    assert answers.asked == 2
    assert wakeups.due_in(clock.now) is not None  # armed again: the retry is not left to the sweep


async def test_an_answer_that_failed_is_asked_for_again(clock: Clock) -> None:
    wakeups, answers = WakeUps(QueueSettings.load()), Answers(None)
    answers.fails = True
    await run(wakeups, answers, clock, CLEAN)
    answers.fails = False
    await run(wakeups, answers, clock, CLEAN)
    assert answers.asked == 2
