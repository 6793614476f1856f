"""Each endpoint's adaptive limit of requests in flight (``outbox.relay.limits``)."""

from __future__ import annotations

from outbox.core.models import NotAttempted, Response, TransportError
from outbox.relay.limits import INITIAL_LIMIT, AdaptiveLimit

OK = Response(204)


def test_it_starts_at_the_initial_limit_within_its_ceiling() -> None:
    assert AdaptiveLimit(512).limit == INITIAL_LIMIT
    assert AdaptiveLimit(4).limit == 4
    assert AdaptiveLimit(4).allows(3)
    assert not AdaptiveLimit(4).allows(4)


def test_answers_at_a_steady_latency_raise_it_up_to_its_ceiling() -> None:
    limit = AdaptiveLimit(100)
    for _ in range(INITIAL_LIMIT):
        limit.answered(OK, 0.1, 0.0)
    assert limit.limit == 2 * INITIAL_LIMIT  # one per answer before any overload
    for _ in range(1000):
        limit.answered(OK, 0.1, 0.0)
    assert limit.limit == 100


def test_an_overload_halves_it_once_per_round_trip() -> None:
    limit = AdaptiveLimit(512)
    for status in (429, 503):
        limit.answered(Response(status), 0.1, now=10.0)
    assert limit.limit == INITIAL_LIMIT / 2  # the second answer is the same overload
    limit.answered(TransportError("timed out"), 0.1, now=10.2)  # a round trip later
    assert limit.limit == INITIAL_LIMIT / 4
    for second in range(20):
        limit.answered(Response(503), 0.1, now=100.0 + second)
    assert limit.limit == 1.0  # never below one request
    assert limit.allows(0)
    assert not limit.allows(1)


def test_after_an_overload_it_grows_by_one_per_round_trip() -> None:
    limit = AdaptiveLimit(512)
    limit.answered(Response(429), 0.1, now=1.0)
    for _ in range(8):  # the limit's worth of answers: one round trip
        limit.answered(OK, 0.1, now=2.0)
    assert 8.9 < limit.limit < 9.0


def test_a_rising_latency_stops_its_growth() -> None:
    limit = AdaptiveLimit(512)
    for _ in range(4):
        limit.answered(OK, 0.01, 0.0)
    grown = limit.limit
    for _ in range(50):
        limit.answered(OK, 1.0, 0.0)  # a hundred times slower than it was
    assert limit.limit <= grown + 1  # the smoothed latency doubled at once: no more growth
    for _ in range(200):
        limit.answered(OK, 1.0, 0.0)
    assert limit.limit > grown + 1  # the baseline caught up with the new latency: it grows again


def test_other_answers_leave_it_alone() -> None:
    limit = AdaptiveLimit(512)
    for result in (Response(500), NotAttempted("relay stopping")):
        limit.answered(result, 0.1, 0.0)
    assert limit.limit == INITIAL_LIMIT
