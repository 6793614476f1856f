from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from outbox.core.backoff import (
    MAX_DELAY_SECONDS,
    backoff_delay,
    parse_retry_after,
    retry_delay,
)

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("attempt", "seconds"),
    [(1, 10), (2, 20), (3, 40), (4, 80), (5, 160), (6, 320), (7, 640), (8, 1280), (9, 1800)],
)
def test_backoff_doubles_from_ten_seconds(attempt: int, seconds: float) -> None:
    assert backoff_delay(attempt) == seconds


@pytest.mark.parametrize("attempt", [9, 10, 20, 100, 10_000])
def test_backoff_is_capped_at_thirty_minutes(attempt: int) -> None:
    assert backoff_delay(attempt) == MAX_DELAY_SECONDS == 1800


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        backoff_delay(0)


@pytest.mark.parametrize("attempt", [1, 3, 9, 50])
def test_jitter_stays_within_ten_percent_below_nominal(attempt: int) -> None:
    nominal = backoff_delay(attempt)
    assert retry_delay(attempt, rand=lambda: 0.0) == nominal
    assert retry_delay(attempt, rand=lambda: 0.999999) == pytest.approx(nominal * 0.9, rel=1e-5)
    assert retry_delay(attempt, rand=lambda: 0.5) <= MAX_DELAY_SECONDS


def test_retry_after_overrides_backoff_and_is_not_jittered() -> None:
    assert retry_delay(1, 120.0, rand=lambda: 0.9) == 120.0
    assert retry_delay(5, 3.0) == 3.0


def test_retry_after_is_clamped_to_the_cap_and_a_one_second_floor() -> None:
    assert retry_delay(1, 86_400.0) == MAX_DELAY_SECONDS
    assert retry_delay(1, 0.0) == 1.0


def test_retry_after_parses_delta_seconds_and_http_dates() -> None:
    assert parse_retry_after("120", NOW) == 120.0
    assert parse_retry_after(" 7 ", NOW) == 7.0
    later = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, NOW) == 90.0
    earlier = format_datetime(NOW - timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(earlier, NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "soon",
        "-5",
        "1.5",
        "Mon, 99 Foo 2026",
        "\u00b2",
        "\u0663",
        "1\u00b2",
        "Mon, 01 Jan 999999999999 00:00:00 GMT",
    ],
)
def test_unreadable_retry_after_is_ignored(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None
