"""Turn what happened on the wire into what is written back: the one place outcomes are decided.

- 2xx                                     -> Processed
- transport error, 408, 429, 5xx          -> Pending after a backoff (or Retry-After), until the
                                             attempts run out -> Failed
- any other status (3xx: redirects are not followed; 4xx), no endpoint, unsendable payload
                                          -> Failed at once
- never attempted (lease too short, run stopped) -> Pending, due now, attempt not counted
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from outbox.backoff import parse_retry_after, retry_delay
from outbox.models import (
    DeliveryResult,
    NotAttempted,
    Outcome,
    Response,
    Status,
    TransportError,
    Undeliverable,
)
from outbox.text import escape_controls, storable

MAX_ERROR_CHARS = 500
MAX_SNIPPET_CHARS = 512
RETRYABLE_STATUSES = frozenset({408, 429})


def classify(
    result: DeliveryResult,
    *,
    attempt: int,
    max_attempts: int,
    now: datetime,
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """The outcome of the ``attempt``-th delivery of a message (pure: no I/O, no clock)."""
    match result:
        case NotAttempted():
            return Outcome(Status.PENDING, 0.0, None, not_attempted=True)
        case Undeliverable(reason=reason):
            return Outcome(Status.FAILED, error=bounded(reason))
        case TransportError(description=description):
            return _retry(description, attempt, max_attempts, None, rand)
        case Response(status=status) if 200 <= status < 300:
            return Outcome(Status.PROCESSED)
        case Response(status=status, snippet=snippet, retry_after=header):
            error = describe_response(status, snippet)
            if status in RETRYABLE_STATUSES or 500 <= status < 600:
                wait = parse_retry_after(header, now)
                return _retry(error, attempt, max_attempts, wait, rand)
            if 300 <= status < 400:
                error = f"{error} (redirects are not followed: configure the final URL)"
            return Outcome(Status.FAILED, error=bounded(error))
    raise TypeError(f"not a delivery result: {result!r}")  # pragma: no cover - exhaustive above


def _retry(
    error: str,
    attempt: int,
    max_attempts: int,
    retry_after: float | None,
    rand: Callable[[], float],
) -> Outcome:
    if attempt >= max_attempts:
        return Outcome(Status.FAILED, error=bounded(f"gave up after {attempt} attempts: {error}"))
    return Outcome(Status.PENDING, retry_delay(attempt, retry_after, rand=rand), bounded(error))


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What the attempt history keeps besides the outcome: an HTTP status or an error class."""

    http_status: int | None = None
    error_class: str | None = None
    response_snippet: str | None = None


def attempt_facts(result: DeliveryResult) -> AttemptFacts:
    """The history columns for a delivery result (pure)."""
    match result:
        case Response(status=status, snippet=snippet):
            shown = escape_controls(storable(snippet[:MAX_SNIPPET_CHARS]), keep="\n\t")
            return AttemptFacts(status, None, shown or None)
        case TransportError(error_class=error_class):
            return AttemptFacts(None, error_class)
        case Undeliverable():
            return AttemptFacts(None, "Undeliverable")
    return AttemptFacts(None, "NotAttempted")


def describe_response(status: int, snippet: str) -> str:
    """``HTTP 503: <start of the body>``, one line."""
    text = " ".join(snippet.split())
    return f"HTTP {status}: {text}" if text else f"HTTP {status}"


def bounded(text: str) -> str:
    """``text`` on one line, its control characters escaped, cut to MAX_ERROR_CHARS, whatever
    the receiver or library sent."""
    text = escape_controls(" ".join(storable(text).split()))
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
