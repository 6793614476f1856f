"""Turn what happened on the wire into what is written back: the one place outcomes are decided.

Per endpoint (``classify``):

- 2xx                                     -> Processed
- 410 Gone (the receiver says "stop"), a status of the endpoint's ``final_statuses``, no
  endpoint for the event type, a payload that cannot be sent   -> Failed at once
- any other answer (3xx: redirects are not followed; 4xx; 5xx), a transport error
                                          -> Pending after a backoff (or Retry-After), until the
                                             endpoint's attempts run out -> Failed
- never attempted (lease too short, run stopped, breaker open) -> Pending, the attempt not counted

Per message (``aggregate``): Processed once every endpoint is; Failed once an endpoint failed for
good and the others are done; Pending while any endpoint still waits (due with the earliest).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from outbox.core.backoff import parse_retry_after, retry_delay
from outbox.core.models import (
    Delivered,
    DeliveryResult,
    EndpointState,
    LeasedMessage,
    NotAttempted,
    Outcome,
    Response,
    Status,
    TransportError,
    Undeliverable,
)
from outbox.core.text import escape_controls, storable

MAX_ERROR_CHARS = 500
MAX_SNIPPET_CHARS = 512
GONE = 410
# Answers that say the endpoint is unwell (not merely refusing this message): they count
# towards its circuit breaker, like transport errors.
UNWELL_STATUSES = frozenset({408, 429})


def classify(
    result: DeliveryResult,
    *,
    attempt: int,
    max_attempts: int,
    now: datetime,
    final_statuses: Sequence[int] = (),
    rand: Callable[[], float] = random.random,
) -> Outcome:
    """The outcome of the ``attempt``-th delivery to an endpoint (pure: no I/O, no clock)."""
    match result:
        case NotAttempted(retry_in=retry_in):
            return Outcome(Status.PENDING, retry_in, None, not_attempted=True)
        case Undeliverable(reason=reason):
            return Outcome(Status.FAILED, error=bounded(reason))
        case TransportError(description=description):
            return _retry(description, attempt, max_attempts, None, rand)
        case Response(status=status) if 200 <= status < 300:
            return Outcome(Status.PROCESSED)
        case Response(status=status, snippet=snippet, retry_after=header):
            error = describe_response(status, snippet)
            if 300 <= status < 400:
                error = f"{error} (redirects are not followed: update the endpoint's URL)"
            if status == GONE or status in final_statuses:
                return Outcome(Status.FAILED, error=bounded(error))
            wait = parse_retry_after(header, now)
            return _retry(error, attempt, max_attempts, wait, rand)
    raise TypeError(f"not a delivery result: {result!r}")  # pragma: no cover - exhaustive above


def unwell(result: DeliveryResult) -> bool | None:
    """Whether ``result`` counts against the endpoint's breaker (True), clears it (False: the
    endpoint answered), or says nothing of it (None: never sent)."""
    match result:
        case TransportError():
            return True
        case Response(status=status):
            return status in UNWELL_STATUSES or status >= 500
    return None


def aggregate(
    message: LeasedMessage, deliveries: Sequence[Delivered], endpoints: Sequence[str]
) -> tuple[Outcome, dict[str, EndpointState] | None]:
    """The message's outcome from its endpoints' this time and before, and where the endpoints
    stand afterwards (None when they stand alike, as the row says: nothing to keep)."""
    if not endpoints:  # nothing to deliver to: the one outcome says why
        return deliveries[0].outcome, None
    if _delivered_at_once(message, deliveries, endpoints):
        return Outcome(Status.PROCESSED), None
    states, due = _states(message, deliveries, endpoints)
    attempted = any(not d.outcome.not_attempted for d in deliveries)
    pending = [name for name in endpoints if states[name].status is Status.PENDING]
    error = _error(deliveries, states, len(endpoints) > 1)
    if pending:
        delay = min(due.get(name, 0.0) for name in pending)
        outcome = Outcome(Status.PENDING, delay, error, not_attempted=not attempted)
    elif any(state.status is Status.FAILED for state in states.values()):
        outcome = Outcome(Status.FAILED, error=error)
    else:
        return Outcome(Status.PROCESSED), None
    attempts_after = message.attempt - (0 if attempted else 1)
    alike = all(
        state.status is Status.PENDING and state.attempts == attempts_after
        for state in states.values()
    )
    return outcome, None if alike else states


def as_tried(
    message: LeasedMessage, endpoints: Sequence[str], tried: Collection[str | None]
) -> LeasedMessage:
    """``message`` with where its ``endpoints`` stand made explicit, where the row keeps no state
    but its attempt history (``tried``: the endpoints it names) shows that some of them were never
    sent the message: an endpoint renamed, or added to the event type, since. Those start at their
    first attempt; the endpoints tried stand where the row is.

    Unchanged where the history names every endpoint, or cannot tell: no attempt recorded (every
    lease so far lost with its outcome, which counts for every endpoint) or one recorded before
    endpoints were named.
    """
    if message.endpoint_state is not None or not tried or None in tried:
        return message
    if all(name in tried for name in endpoints):
        return message
    before = message.attempt - 1
    state = {name: EndpointState(Status.PENDING, before) for name in endpoints if name in tried}
    return message._replace(endpoint_state=state)


def _delivered_at_once(
    message: LeasedMessage, deliveries: Sequence[Delivered], endpoints: Sequence[str]
) -> bool:
    """The usual case, decided without building every endpoint's state: the one endpoint, with
    nothing kept from before, answered 2xx."""
    if len(endpoints) != 1 or len(deliveries) != 1 or message.endpoint_state:
        return False
    [delivered] = deliveries
    outcome = delivered.outcome
    return (
        delivered.endpoint == endpoints[0]
        and outcome.status is Status.PROCESSED
        and not outcome.not_attempted
    )


def _states(
    message: LeasedMessage, deliveries: Sequence[Delivered], endpoints: Sequence[str]
) -> tuple[dict[str, EndpointState], dict[str, float]]:
    """Each endpoint's state after this time, and when each pending one is due (seconds)."""
    prior: Mapping[str, EndpointState] = message.endpoint_state or {}
    # Without a kept state every endpoint was where the row is: tried at every earlier lease
    # (``as_tried`` makes the state explicit where the history says otherwise). With one, an
    # endpoint it does not name was never sent the message.
    before = 0 if message.endpoint_state is not None else message.attempt - 1
    states = {name: prior.get(name) or EndpointState(Status.PENDING, before) for name in endpoints}
    due: dict[str, float] = {}
    for delivered in deliveries:
        name, outcome = delivered.endpoint, delivered.outcome
        if name is None or name not in states:
            continue
        if outcome.not_attempted:
            due[name] = outcome.delay_seconds
            continue
        states[name] = EndpointState(outcome.status, delivered.number, outcome.error)
        due[name] = outcome.delay_seconds
    return states, due


def _error(
    deliveries: Sequence[Delivered], states: Mapping[str, EndpointState], named: bool
) -> str | None:
    """The message's last_error: its first endpoint's error this time (named, when it has
    several), else a failed endpoint's from before."""
    for delivered in deliveries:
        if delivered.outcome.error is not None and not delivered.outcome.not_attempted:
            return _named(delivered.endpoint, delivered.outcome.error, named)
    for name, state in states.items():
        if state.status is Status.FAILED and state.error is not None:
            return _named(name, state.error, named)
    return None


def _named(endpoint: str | None, error: str, named: bool) -> str:
    return bounded(f"{endpoint}: {error}") if named and endpoint else error


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
