"""The breaker's policy on its own: ``BreakerBook`` is pure, so its clock is a number set here and
what it says to persist (``Count``, ``Close``) is looked at rather than written. The writes
themselves and the cool-down's doubling (computed by the database, shared by every relay) are
tested against PostgreSQL in tests/reliability/test_breakers.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from outbox.relay.breakers import (
    COOL_DOWN_SECONDS,
    PAUSED_RETRY_SECONDS,
    PROBE,
    SEND,
    THRESHOLD,
    BreakerBook,
    Close,
    Count,
)

KEY = ("OrderPlaced", "orders")


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Seen:
    """A breaker as a lease read it (the shape of ``store.BreakerSeen``)."""

    event_type: str
    endpoint: str
    failures: int
    reopen_in: float | None
    probing: bool = False
    paused: bool = False


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def book(clock: Clock) -> BreakerBook:
    return BreakerBook(clock)


def fail(book: BreakerBook, times: int, *, probe: bool = False) -> list[Count | Close | None]:
    return [book.observed(KEY, True, probe=probe) for _ in range(times)]


def test_it_opens_after_threshold_failures_in_a_row_and_says_to_count_them_all(
    book: BreakerBook,
) -> None:
    decisions = fail(book, THRESHOLD)
    assert decisions[:-1] == [None] * (THRESHOLD - 1)  # below the threshold: nothing to write
    count = decisions[-1]
    assert isinstance(count, Count)
    assert (count.key, count.failures, count.probe_failed, count.announce) == (
        KEY,
        THRESHOLD,
        False,
        True,
    )
    # Open here at once, for the first cool-down, before the database has answered.
    assert book.verdict(KEY) == pytest.approx(COOL_DOWN_SECONDS[0])


def test_an_answer_between_failures_starts_the_count_again(book: BreakerBook) -> None:
    fail(book, THRESHOLD - 1)
    assert book.observed(KEY, False, probe=False) == Close(KEY)  # failures were known: close
    assert fail(book, THRESHOLD - 1) == [None] * (THRESHOLD - 1)
    assert book.verdict(KEY) == SEND


def test_a_healthy_endpoints_answer_asks_for_no_write(book: BreakerBook) -> None:
    assert book.observed(KEY, False, probe=False) is None
    assert book.observed(KEY, None, probe=False) is None  # never sent
    assert book.verdict(KEY) == SEND


def test_the_book_takes_the_databases_cool_down_doubling_included(
    book: BreakerBook, clock: Clock
) -> None:
    count = fail(book, THRESHOLD)[-1]
    assert isinstance(count, Count)
    book.written(count, reopen_in=10.0)
    clock.now += 10.0
    assert book.verdict(KEY) == PROBE  # the cool-down is over: claim the probe first
    book.claiming(KEY)
    book.claimed(KEY, True)
    assert book.holds_back(KEY)  # the rest wait for the probe's answer
    [failed_probe] = fail(book, 1, probe=True)
    assert isinstance(failed_probe, Count)
    assert (failed_probe.failures, failed_probe.probe_failed) == (1, True)
    assert not book.holds_back(KEY)
    assert book.verdict(KEY) == pytest.approx(COOL_DOWN_SECONDS[0])  # at once, here
    # The database doubles the cool-down of an opening in a row and says so: the book takes it.
    book.written(failed_probe, reopen_in=2 * COOL_DOWN_SECONDS[0])
    assert book.verdict(KEY) == pytest.approx(2 * COOL_DOWN_SECONDS[0])


def test_a_probe_claimed_by_another_relay_makes_this_one_wait_without_holding_back(
    book: BreakerBook, clock: Clock
) -> None:
    book.learn([Seen(*KEY, failures=THRESHOLD, reopen_in=-1.0)], as_of=clock.now)
    assert book.verdict(KEY) == PROBE
    book.claiming(KEY)
    assert book.holds_back(KEY)  # no second claim, no delivery, while the claim is out
    assert book.verdict(KEY) == 1.0
    book.claimed(KEY, False)
    assert not book.holds_back(KEY)
    assert book.verdict(KEY) == 1.0  # they wait for the other relay's probe


def test_a_successful_probe_closes_the_breaker(book: BreakerBook, clock: Clock) -> None:
    book.learn([Seen(*KEY, failures=THRESHOLD, reopen_in=-1.0)], as_of=clock.now)
    book.claiming(KEY)
    book.claimed(KEY, True)
    assert book.observed(KEY, False, probe=True) == Close(KEY)
    assert not book.holds_back(KEY)
    assert book.verdict(KEY) == SEND


def test_a_probe_not_sent_is_given_back(book: BreakerBook, clock: Clock) -> None:
    book.learn([Seen(*KEY, failures=THRESHOLD, reopen_in=-1.0)], as_of=clock.now)
    book.claiming(KEY)
    book.claimed(KEY, True)
    assert book.observed(KEY, None, probe=True) is None
    assert not book.holds_back(KEY)  # another delivery may probe


def test_a_breaker_being_written_wins_over_what_a_lease_read(
    book: BreakerBook, clock: Clock
) -> None:
    count = fail(book, THRESHOLD)[-1]
    assert isinstance(count, Count)
    # A lease sent after the failures (so newer than the book's change by time) returns while
    # their count is still being written: it read the endpoint before the write, healthy.
    clock.now += 1.0
    book.learn([], as_of=clock.now)
    book.learn([Seen(*KEY, failures=0, reopen_in=None)], as_of=clock.now)
    assert book.verdict(KEY) == pytest.approx(COOL_DOWN_SECONDS[0] - 1.0)  # still open
    book.written(count, reopen_in=COOL_DOWN_SECONDS[0])
    # Once written, a later lease's view is the newer one.
    clock.now += 1.0
    book.learn([Seen(*KEY, failures=0, reopen_in=None)], as_of=clock.now)
    assert book.verdict(KEY) == SEND


def test_failures_not_written_are_counted_again_with_the_next_ones(book: BreakerBook) -> None:
    count = fail(book, THRESHOLD)[-1]
    assert isinstance(count, Count)
    book.not_written(count)
    fail(book, 2)
    [(key, breaker)] = book.unsaved()
    again = book.count_unsaved(key, breaker)
    assert again is not None
    assert (again.failures, again.announce) == (THRESHOLD + 2, False)
    assert book.count_unsaved(key, breaker) is None  # taken: nothing left to count


def test_an_abandoned_write_no_longer_keeps_the_lease_out(book: BreakerBook, clock: Clock) -> None:
    count = fail(book, THRESHOLD)[-1]
    assert isinstance(count, Count)
    book.abandoned(count)
    clock.now += 1.0
    book.learn([Seen(*KEY, failures=0, reopen_in=None)], as_of=clock.now)
    assert book.verdict(KEY) == SEND


def test_a_paused_endpoint_waits_without_sending_until_a_lease_reads_it_resumed(
    book: BreakerBook,
) -> None:
    other = ("OrderCompleted", "audit")
    book.learn([Seen(*KEY, failures=0, reopen_in=None, paused=True)], as_of=0.0)
    assert book.paused(KEY)
    assert book.verdict(KEY) == PAUSED_RETRY_SECONDS
    assert book.verdict(other) == SEND
    book.learn([], as_of=1.0)
    assert not book.paused(KEY)
    assert book.verdict(KEY) == SEND
