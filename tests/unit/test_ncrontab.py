from __future__ import annotations

from datetime import UTC, datetime

import pytest

from outbox.hosting.ncrontab import Schedule


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2026-01-01T00:00:00", "2026-01-01T00:05:00"),
        ("2026-01-01T00:04:59", "2026-01-01T00:05:00"),
        ("2026-01-01T00:05:00", "2026-01-01T00:10:00"),
        ("2026-01-01T23:58:30", "2026-01-02T00:00:00"),
        ("2026-12-31T23:59:59.5", "2027-01-01T00:00:00"),
    ],
)
def test_every_five_minutes(after: str, expected: str) -> None:
    assert Schedule.parse("0 */5 * * * *").next_after(at(after)) == at(expected)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ("2026-01-01T00:00:00", "2026-01-01T03:30:00"),
        ("2026-01-01T03:30:00", "2026-01-02T03:30:00"),
        ("2026-02-28T04:00:00", "2026-03-01T03:30:00"),
    ],
)
def test_daily_at_half_past_three(after: str, expected: str) -> None:
    assert Schedule.parse("0 30 3 * * *").next_after(at(after)) == at(expected)


def test_lists_ranges_months_and_weekdays() -> None:
    schedule = Schedule.parse("15 0,30 9-10 * 6 1-5")  # June, weekdays
    assert schedule.next_after(at("2026-05-31T12:00:00")) == at("2026-06-01T09:00:15")
    assert schedule.next_after(at("2026-06-05T10:30:15")) == at("2026-06-08T09:00:15")


@pytest.mark.parametrize(
    "expression", ["* * * * *", "61 * * * * *", "0 */0 * * * *", "a * * * * *"]
)
def test_bad_schedules_are_refused(expression: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies by the mistake
        Schedule.parse(expression)
