"""When a retryable failure is tried again: the seed's exponential backoff and Retry-After."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

BASE_DELAY_SECONDS = 10.0
MAX_DELAY_SECONDS = 30 * 60.0
# Downward jitter: a retry lands between 90% and 100% of its nominal delay, so messages that failed
# together do not all come back in the same instant, and the cap stays a cap.
JITTER_FRACTION = 0.1
# A Retry-After of 0 would re-lease the row in the same run, in a tight loop.
MIN_RETRY_AFTER_SECONDS = 1.0


def backoff_delay(attempt: int) -> float:
    """Nominal delay after failed attempt number ``attempt``: 10 s · 2^(attempt-1), max 30 min."""
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    # Beyond 2^8 the cap applies anyway; stopping there avoids huge floats for large attempts.
    exponent = min(attempt - 1, 16)
    return min(MAX_DELAY_SECONDS, BASE_DELAY_SECONDS * float(2**exponent))


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from ``now`` that a Retry-After header asks for (delta-seconds or HTTP-date)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # "²" and "٣" are digits to str, not to HTTP
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a year past any clock
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def retry_delay(
    attempt: int,
    retry_after: float | None = None,
    *,
    rand: Callable[[], float] = random.random,
) -> float:
    """Delay before the next attempt: the receiver's Retry-After if it gave one, else the backoff.

    Both are clamped to the 30-minute cap; only the computed backoff is jittered.
    """
    if retry_after is not None:
        return min(MAX_DELAY_SECONDS, max(MIN_RETRY_AFTER_SECONDS, retry_after))
    return backoff_delay(attempt) * (1.0 - JITTER_FRACTION * rand())
