from __future__ import annotations

from datetime import UTC, datetime

import pytest

from outbox.core.models import (
    NotAttempted,
    Outcome,
    Response,
    Status,
    TransportError,
    Undeliverable,
)
from outbox.core.outcomes import MAX_ERROR_CHARS, attempt_facts, classify, unwell

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def outcome_of(result: object, attempt: int = 1, max_attempts: int = 5) -> Outcome:
    return classify(
        result,  # type: ignore[arg-type]
        attempt=attempt,
        max_attempts=max_attempts,
        now=NOW,
        rand=lambda: 0.0,
    )


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_processed_and_clears_the_error(status: int) -> None:
    assert outcome_of(Response(status)) == Outcome(Status.PROCESSED, 0.0, None)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses_go_back_to_pending_with_backoff(status: int) -> None:
    outcome = outcome_of(Response(status, snippet="busy"), attempt=3)
    assert outcome.status is Status.PENDING
    assert outcome.delay_seconds == 40.0
    assert outcome.error == f"HTTP {status}: busy"
    assert not outcome.not_attempted


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 413, 422, 451])
def test_other_4xx_are_retried_as_a_receiver_s_mistake_usually_heals(status: int) -> None:
    # A 401 from a rotated secret, a 404 from a deployment in progress, a 403 from a clock:
    # retried like Svix, Stripe and Convoy do, not failed for good.
    outcome = outcome_of(Response(status, snippet="nope"), attempt=1)
    assert outcome == Outcome(Status.PENDING, 10.0, f"HTTP {status}: nope")


def test_410_gone_fails_at_once() -> None:
    assert outcome_of(Response(410, snippet="gone")) == Outcome(
        Status.FAILED, 0.0, "HTTP 410: gone"
    )


def test_an_endpoint_s_final_statuses_fail_at_once() -> None:
    for status in (400, 422):
        outcome = classify(
            Response(status), attempt=1, max_attempts=5, now=NOW, final_statuses=(400, 422)
        )
        assert outcome == Outcome(Status.FAILED, 0.0, f"HTTP {status}")
    again = classify(Response(404), attempt=1, max_attempts=5, now=NOW, final_statuses=(400,))
    assert again.status is Status.PENDING


@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 307, 308])
def test_redirects_are_retried_and_say_to_update_the_url(status: int) -> None:
    outcome = outcome_of(Response(status))
    assert outcome.status is Status.PENDING
    assert outcome.error is not None
    assert outcome.error.startswith(f"HTTP {status}")
    assert "redirects are not followed: update the endpoint's URL" in outcome.error


@pytest.mark.parametrize("status", [100, 199, 600, 999])
def test_statuses_outside_the_known_classes_are_retried(status: int) -> None:
    assert outcome_of(Response(status)).status is Status.PENDING


@pytest.mark.parametrize(
    ("result", "verdict"),
    [
        (TransportError("refused"), True),
        (Response(500), True),
        (Response(503), True),
        (Response(429), True),
        (Response(408), True),
        (Response(200), False),
        (Response(404), False),
        (Response(410), False),
        (NotAttempted("stopping"), None),
        (Undeliverable("no endpoint"), None),
    ],
)
def test_what_counts_against_an_endpoint_s_breaker(result: object, verdict: bool | None) -> None:
    assert unwell(result) is verdict  # type: ignore[arg-type]


def test_transport_errors_are_retried() -> None:
    outcome = outcome_of(TransportError("ClientConnectorError: refused"), attempt=1)
    assert outcome == Outcome(Status.PENDING, 10.0, "ClientConnectorError: refused")


def test_retry_after_is_honoured_on_429_and_503() -> None:
    assert outcome_of(Response(429, retry_after="120")).delay_seconds == 120.0
    assert outcome_of(Response(503, retry_after="5"), attempt=4).delay_seconds == 5.0


def test_retry_after_on_a_permanent_status_does_not_make_it_retryable() -> None:
    assert outcome_of(Response(410, retry_after="5")).status is Status.FAILED


@pytest.mark.parametrize(
    "result", [Response(500), Response(429), Response(408), TransportError("timed out after 5s")]
)
def test_last_allowed_attempt_fails_instead_of_retrying(result: object) -> None:
    assert outcome_of(result, attempt=4, max_attempts=5).status is Status.PENDING
    outcome = outcome_of(result, attempt=5, max_attempts=5)
    assert outcome.status is Status.FAILED
    assert outcome.error is not None
    assert outcome.error.startswith("gave up after 5 attempts: ")


def test_undeliverable_fails_at_once_even_on_the_first_attempt() -> None:
    outcome = outcome_of(Undeliverable("no endpoint configured for event type 'X'"))
    assert outcome == Outcome(Status.FAILED, 0.0, "no endpoint configured for event type 'X'")


def test_not_attempted_is_released_without_counting_the_attempt() -> None:
    outcome = outcome_of(NotAttempted("relay stopping"), attempt=5, max_attempts=5)
    assert outcome == Outcome(Status.PENDING, 0.0, None, not_attempted=True)


def test_transport_errors_are_folded_onto_one_line() -> None:
    outcome = outcome_of(TransportError("ClientOSError: reset\n  by peer\r\n\tdetails"))
    assert outcome.error == "ClientOSError: reset by peer details"


def test_error_text_is_bounded_and_on_one_line() -> None:
    outcome = outcome_of(Response(500, snippet="line one\nline two " + "x" * 5000))
    assert outcome.error is not None
    assert len(outcome.error) == MAX_ERROR_CHARS
    assert "\n" not in outcome.error
    assert outcome.error.startswith("HTTP 500: line one line two x")


@pytest.mark.parametrize(
    "result",
    [Response(503, snippet="a\x00b"), TransportError("Weird: a\x00b"), Undeliverable("a\x00b")],
)
def test_nul_characters_never_reach_the_stored_text(result: object) -> None:
    # PostgreSQL text cannot hold U+0000; one in a receiver's answer must not fail the write.
    outcome = outcome_of(result)
    facts = attempt_facts(result)  # type: ignore[arg-type]
    assert outcome.error is not None
    assert "\x00" not in outcome.error
    assert "a\ufffdb" in outcome.error
    assert "\x00" not in (facts.response_snippet or "")
