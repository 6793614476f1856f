"""The two stopping rules, without a database: what ends a drain and what ends a hint's run."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

from outbox.core.models import Attempt, LeasedMessage, Outcome, Recorded, Response, Status
from outbox.relay.stopping import UntilCaughtUp, UntilEmpty, stop_rule


def record(outcome: Outcome) -> Recorded:
    message = LeasedMessage(uuid.uuid4(), "X", "{}", 2, 1, uuid.uuid4(), datetime.now(UTC))
    return Recorded(message, outcome, Attempt(Response(200), datetime.now(UTC), 1))


def test_a_drain_never_stops_when_caught_up_and_sweeps_first() -> None:
    rule = stop_rule(until_caught_up=False)
    assert isinstance(rule, UntilEmpty)
    rule.recorded([record(Outcome(Status.PENDING, 0.0, not_attempted=True))], True)
    assert (rule.caught_up(), rule.sweeps) == (False, True)


def test_a_hint_s_run_stops_once_caught_up_when_nothing_it_recorded_is_due() -> None:
    rule = stop_rule(until_caught_up=True)
    assert isinstance(rule, UntilCaughtUp)
    rule.recorded([record(Outcome(Status.PROCESSED)), record(Outcome(Status.FAILED))], False)
    rule.recorded([record(Outcome(Status.PENDING, 30.0, "HTTP 503"))], False)  # due later
    assert (rule.caught_up(), rule.sweeps) == (True, False)


def test_a_hint_s_run_leases_again_for_what_it_gave_back_or_let_go() -> None:
    rule = UntilCaughtUp()
    given_back = Outcome(Status.PENDING, 0.0, None, not_attempted=True)
    rule.recorded([record(given_back)], False)
    assert rule.caught_up() is False
    assert rule.caught_up() is True  # what it kept is reset at each question
    rule.recorded([record(Outcome(Status.PROCESSED))], True)  # the next of a key is due
    assert rule.caught_up() is False


def test_a_short_retry_keeps_a_hint_s_run_going_once_it_is_due() -> None:
    rule = UntilCaughtUp()
    rule.recorded([record(Outcome(Status.PENDING, 0.5, "HTTP 503"))], False)
    assert rule.due_again > time.monotonic()
    time.sleep(0.6)
    assert rule.caught_up() is False
