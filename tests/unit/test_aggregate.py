"""A message's outcome from its endpoints' (pure): the one place the row's status is derived."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from outbox.core.models import (
    Attempt,
    Delivered,
    EndpointState,
    LeasedMessage,
    NotAttempted,
    Outcome,
    Response,
    Status,
)
from outbox.core.outcomes import aggregate, as_tried

NOW = datetime(2026, 1, 2, tzinfo=UTC)
DONE = Outcome(Status.PROCESSED)
RETRY = Outcome(Status.PENDING, 20.0, "HTTP 503")
GONE = Outcome(Status.FAILED, error="HTTP 410: gone")


def message(attempt: int = 1, state: dict[str, EndpointState] | None = None) -> LeasedMessage:
    return LeasedMessage(
        uuid.uuid4(), "OrderCompleted", "{}", 2, attempt, uuid.uuid4(), NOW, None, state
    )


def delivered(endpoint: str, outcome: Outcome, number: int = 1) -> Delivered:
    return Delivered(endpoint, number, Attempt(Response(200), NOW, 1), outcome)


def test_one_endpoint_keeps_its_state_in_the_row_until_it_fails() -> None:
    assert aggregate(message(), [delivered("a", DONE)], ["a"]) == (DONE, None)
    assert aggregate(message(), [delivered("a", RETRY)], ["a"]) == (RETRY, None)
    outcome, state = aggregate(message(), [delivered("a", GONE)], ["a"])
    # Kept once failed: a requeue of that endpoint's failures finds it.
    assert (outcome.status, state) == (
        Status.FAILED,
        {"a": EndpointState(Status.FAILED, 1, GONE.error)},
    )


def test_every_endpoint_must_succeed_for_the_message_to_be_processed() -> None:
    both = [delivered("billing", DONE), delivered("shipping", DONE)]
    assert aggregate(message(), both, ["billing", "shipping"]) == (DONE, None)
    outcome, state = aggregate(
        message(),
        [delivered("billing", DONE), delivered("shipping", RETRY)],
        ["billing", "shipping"],
    )
    assert outcome == Outcome(Status.PENDING, 20.0, "shipping: HTTP 503")
    assert state == {
        "billing": EndpointState(Status.PROCESSED, 1),
        "shipping": EndpointState(Status.PENDING, 1, "HTTP 503"),
    }


def test_a_retry_goes_only_to_endpoints_not_yet_done_and_counts_their_own_attempts() -> None:
    before = {
        "billing": EndpointState(Status.PROCESSED, 1),
        "shipping": EndpointState(Status.PENDING, 1, "HTTP 503"),
    }
    outcome, state = aggregate(
        message(attempt=2, state=before), [delivered("shipping", DONE, 2)], ["billing", "shipping"]
    )
    assert (outcome, state) == (DONE, None)


def test_a_failed_endpoint_fails_the_message_once_the_others_are_done() -> None:
    names = ["billing", "shipping"]
    outcome, _ = aggregate(
        message(), [delivered("billing", GONE), delivered("shipping", RETRY)], names
    )
    assert outcome.status is Status.PENDING  # shipping still gets it
    before = {
        "billing": EndpointState(Status.FAILED, 1, "HTTP 410: gone"),
        "shipping": EndpointState(Status.PENDING, 1, "HTTP 503"),
    }
    outcome, state = aggregate(message(2, before), [delivered("shipping", DONE, 2)], names)
    assert outcome == Outcome(Status.FAILED, error="billing: HTTP 410: gone")
    assert state is not None
    assert state["shipping"].status is Status.PROCESSED


def test_backoff_follows_the_earliest_due_endpoint() -> None:
    later = Outcome(Status.PENDING, 80.0, "HTTP 500")
    outcome, _ = aggregate(message(), [delivered("a", later), delivered("b", RETRY)], ["a", "b"])
    assert outcome.delay_seconds == 20.0


def test_endpoints_that_fail_alike_need_no_state_of_their_own() -> None:
    outcome, state = aggregate(
        message(), [delivered("a", RETRY), delivered("b", RETRY)], ["a", "b"]
    )
    assert (outcome.status, state) == (Status.PENDING, None)


def test_an_endpoint_held_by_its_breaker_spends_no_attempt() -> None:
    held = Outcome(Status.PENDING, 9.0, None, not_attempted=True)
    out, state = aggregate(message(attempt=3), [delivered("a", held, 3)], ["a"])
    assert out == Outcome(Status.PENDING, 9.0, None, not_attempted=True)  # attempt given back
    assert state is None
    out, state = aggregate(message(), [delivered("a", held), delivered("b", DONE)], ["a", "b"])
    assert (out.status, out.delay_seconds, out.not_attempted) == (Status.PENDING, 9.0, False)
    assert state == {"a": EndpointState(Status.PENDING, 0), "b": EndpointState(Status.PROCESSED, 1)}


def test_an_endpoint_added_later_starts_from_its_first_attempt() -> None:
    before = {"a": EndpointState(Status.PROCESSED, 1)}
    out, state = aggregate(message(2, before), [delivered("b", RETRY, 1)], ["a", "b"])
    assert out.status is Status.PENDING
    assert state is not None
    assert state["b"] == EndpointState(Status.PENDING, 1, "HTTP 503")


def test_an_endpoint_the_history_never_names_starts_at_its_first_attempt() -> None:
    # Nine failures at "orders", kept as the row's own (no state); the endpoint is renamed.
    renamed = as_tried(message(attempt=10), ["v2"], {"orders"})
    assert renamed.endpoint_state == {}
    out, state = aggregate(renamed, [delivered("v2", RETRY, 1)], ["v2"])
    assert (out.status, state) == (
        Status.PENDING,
        {"v2": EndpointState(Status.PENDING, 1, "HTTP 503")},
    )
    # Held by its breaker, it spent nothing: still at its first attempt next time.
    held = Outcome(Status.PENDING, 9.0, None, not_attempted=True)
    out, state = aggregate(renamed, [delivered("v2", held, 1)], ["v2"])
    assert (out.not_attempted, state) == (True, {"v2": EndpointState(Status.PENDING, 0)})
    # An endpoint added beside the one tried three times: its first attempt, the other its fourth.
    added = as_tried(message(attempt=4), ["a", "b"], {"a"})
    assert added.endpoint_state == {"a": EndpointState(Status.PENDING, 3)}
    out, state = aggregate(added, [delivered("a", RETRY, 4), delivered("b", RETRY, 1)], ["a", "b"])
    assert state == {
        "a": EndpointState(Status.PENDING, 4, "HTTP 503"),
        "b": EndpointState(Status.PENDING, 1, "HTTP 503"),
    }


def test_the_row_stands_for_every_endpoint_where_the_history_cannot_tell_otherwise() -> None:
    retried = message(attempt=4)
    assert as_tried(retried, ["a", "b"], {"a", "b"}) is retried  # every endpoint tried
    assert as_tried(retried, ["a"], set()) is retried  # leases lost with their outcomes count
    assert as_tried(retried, ["a"], {None}) is retried  # attempts from before endpoints had names
    kept = message(attempt=4, state={"a": EndpointState(Status.PROCESSED, 1)})
    assert as_tried(kept, ["a", "b"], {"a"}) is kept  # the state says it already


def test_no_endpoint_at_all_is_the_one_outcome_that_says_why() -> None:
    nothing = Outcome(Status.FAILED, error="no endpoint configured for event type 'X'")
    lone = Delivered(None, 1, Attempt(NotAttempted("-"), NOW, 0), nothing)
    assert aggregate(message(), [lone], []) == (nothing, None)
