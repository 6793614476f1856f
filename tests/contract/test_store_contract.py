"""The relay's store contract (``outbox.store.contract.RelayStore``): each test runs against
PostgreSQL and against ``MemoryStore`` with the same assertions, so the loop's unit tests over the
memory store stand for what the relay does over PostgreSQL."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence

from outbox.core.models import (
    Attempt,
    Delivered,
    EndpointState,
    LeasedMessage,
    Outcome,
    Recorded,
    Response,
    Status,
    TransportError,
)
from outbox.store.contract import LearnedLimit, OwnLimit, SentAttempt
from tests.contract.conftest import Harness

KEY = ("OrderCompleted", "orders")
LEASE_SECONDS = 30.0


def recorded(
    message: LeasedMessage,
    status: Status,
    *,
    delay: float = 0.0,
    error: str | None = None,
    endpoint: str = "orders",
    state: dict[str, EndpointState] | None = None,
    not_attempted: bool = False,
) -> Recorded:
    """One message's outcome, as the relay's classifier would write it."""
    outcome = Outcome(status, delay, error, not_attempted)
    result = Response(200) if status is Status.PROCESSED else TransportError("refused")
    attempt = Attempt(result, time.time(), 5)
    delivered = Delivered(endpoint, message.attempt, attempt, outcome)
    return Recorded(message, outcome, (delivered,), state)


def sent(message: LeasedMessage, endpoint: str = "orders") -> SentAttempt:
    return SentAttempt(message.message_id, endpoint, message.attempt, time.time(), 5, 200)


async def test_a_lease_takes_due_messages_in_order_each_with_a_fresh_token(
    harness: Harness,
) -> None:
    first, second, third = await harness.add(), await harness.add(), await harness.add()
    (one,) = (await harness.store.lease_batch(1, LEASE_SECONDS)).messages
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert one.message_id == first  # the earliest due first
    assert {m.message_id for m in lease.messages} == {second, third}  # returned in any order
    assert [m.attempt for m in (one, *lease.messages)] == [1, 1, 1]
    assert len({m.lease_token for m in (one, *lease.messages)}) == 3
    assert lease.taken == 2
    assert lease.database_now is not None
    assert (await harness.row(first)).status == "Processing"
    assert (await harness.store.lease_batch(10, LEASE_SECONDS)).messages == []


async def test_a_lease_takes_at_most_its_batch_size(harness: Harness) -> None:
    for _ in range(3):
        await harness.add()
    lease = await harness.store.lease_batch(2, LEASE_SECONDS)
    assert len(lease.messages) == 2
    assert lease.taken == 2
    assert len((await harness.store.lease_batch(2, LEASE_SECONDS)).messages) == 1


async def test_a_lease_reads_past_the_event_types_it_skips(harness: Harness) -> None:
    await harness.add("OrderCompleted")
    other = await harness.add("Unsigned")
    lease = await harness.store.lease_batch(10, LEASE_SECONDS, skip=["OrderCompleted"])
    assert [m.message_id for m in lease.messages] == [other]


async def test_an_expired_lease_is_leased_again_and_the_old_token_is_stale(
    harness: Harness,
) -> None:
    message_id = await harness.add()
    (first,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    assert (await harness.store.lease_batch(10, LEASE_SECONDS)).messages == []  # held
    await harness.expire_lease(message_id)
    (second,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    assert second.attempt == 2
    assert second.lease_token != first.lease_token
    stale = await harness.store.record_outcomes([recorded(first, Status.PROCESSED)])
    assert stale.applied == set()
    assert (await harness.row(message_id)).status == "Processing"
    written = await harness.store.record_outcomes([recorded(second, Status.PROCESSED)])
    assert written.applied == {message_id}
    assert (await harness.row(message_id)).status == "Processed"
    assert [a[3] for a in await harness.attempts(message_id)] == [False, True]


async def test_one_message_of_an_ordering_key_is_in_flight_at_a_time(harness: Harness) -> None:
    first = await harness.add(key="customer-1")
    second = await harness.add(key="customer-1")
    free = await harness.add()
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert {m.message_id for m in lease.messages} == {first, free}  # in any order
    assert len(lease.messages) == 2
    assert (await harness.row(second)).status == "Pending"
    (message,) = [m for m in lease.messages if m.message_id == first]
    written = await harness.store.record_outcomes([recorded(message, Status.PROCESSED)])
    assert written.applied == {first}
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert [m.message_id for m in lease.messages] == [second]


async def test_a_message_behind_one_backing_off_is_parked_then_let_go(harness: Harness) -> None:
    first = await harness.add(key="k")
    second = await harness.add(key="k")
    (message,) = (await harness.store.lease_batch(1, LEASE_SECONDS)).messages
    assert message.message_id == first
    retry = recorded(message, Status.PENDING, delay=60.0, error="HTTP 503")
    await harness.store.record_outcomes([retry])
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert lease.messages == []
    assert lease.parked == 1
    assert lease.taken == 1
    assert (await harness.row(second)).due_in == math.inf
    await harness.make_due(first)
    (again,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    assert again.message_id == first
    assert again.attempt == 2
    written = await harness.store.record_delivered([again], [sent(again)])
    assert written == (written._replace(applied={first}, lets_next_go=True))
    (next_one,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    assert next_one.message_id == second


async def test_a_failed_message_holds_its_key_under_hold_and_not_under_release(
    harness: Harness,
) -> None:
    for hold in (True, False):
        key = f"key-{hold}"
        first = await harness.add(key=key)
        second = await harness.add(key=key)
        (message,) = (
            await harness.store.lease_batch(10, LEASE_SECONDS, hold_on_failure=hold)
        ).messages
        assert message.message_id == first
        failed = recorded(message, Status.FAILED, error="HTTP 400")
        written = await harness.store.record_outcomes([failed], hold_on_failure=hold)
        # Under release the next of its key, due already, may go now.
        assert written.lets_next_go is (not hold)
        lease = await harness.store.lease_batch(10, LEASE_SECONDS, hold_on_failure=hold)
        if hold:
            assert lease.messages == []
            assert lease.parked == 1
            assert (await harness.row(second)).due_in == math.inf
        else:
            assert [m.message_id for m in lease.messages] == [second]


async def test_release_held_lets_go_what_nothing_holds_any_more(harness: Harness) -> None:
    first = await harness.add(key="k")
    second = await harness.add(key="k")
    (message,) = (await harness.store.lease_batch(1, LEASE_SECONDS)).messages
    await harness.store.record_outcomes([recorded(message, Status.FAILED, error="HTTP 400")])
    assert (await harness.store.lease_batch(10, LEASE_SECONDS)).parked == 1
    assert await harness.store.release_held(hold_on_failure=True) == 0  # still held
    assert await harness.store.release_held(hold_on_failure=False) == 1  # the rule changed
    assert (await harness.row(second)).due_in is not None
    assert (await harness.row(second)).due_in <= 0
    assert (await harness.row(first)).status == "Failed"


async def test_outcomes_are_written_processed_retried_and_failed(harness: Harness) -> None:
    ids = [await harness.add() for _ in range(3)]
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    leased = {m.message_id: m for m in lease.messages}
    done, retried, failed = (leased[i] for i in ids)  # a lease returns its rows in any order
    records = [
        recorded(done, Status.PROCESSED),
        recorded(retried, Status.PENDING, delay=30.0, error="HTTP 503"),
        recorded(failed, Status.FAILED, error="HTTP 410"),
    ]
    written = await harness.store.record_outcomes(records)
    assert written.applied == set(ids)
    assert written.lets_next_go is False
    states = [await harness.row(i) for i in ids]
    assert [s.status for s in states] == ["Processed", "Pending", "Failed"]
    assert [s.last_error for s in states] == [None, "HTTP 503", "HTTP 410"]
    assert states[1].due_in is not None
    assert 25 < states[1].due_in <= 30
    assert [a[2] for i in ids for a in await harness.attempts(i)] == [
        "Processed",
        "Pending",
        "Failed",
    ]
    assert 25 < (await harness.store.next_due_in() or 0) <= 30


async def test_a_message_given_back_keeps_its_attempt_count_and_gets_no_history(
    harness: Harness,
) -> None:
    message_id = await harness.add()
    (message,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    given_back = recorded(message, Status.PENDING, not_attempted=True, error="not sent")
    assert (await harness.store.record_outcomes([given_back])).applied == {message_id}
    state = await harness.row(message_id)
    assert (state.status, state.attempts, state.last_error) == ("Pending", 0, None)
    assert await harness.attempts(message_id) == []
    assert await harness.store.next_due_in() is None  # due now: nothing waits for a time


async def test_the_endpoint_state_is_kept_and_returned_with_the_next_lease(
    harness: Harness,
) -> None:
    message_id = await harness.add()
    (message,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    state = {
        "orders": EndpointState(Status.PROCESSED, 1),
        "audit": EndpointState(Status.PENDING, 1, "HTTP 503"),
    }
    outcome = recorded(message, Status.PENDING, delay=0.0, error="HTTP 503", state=state)
    await harness.store.record_outcomes([outcome])
    assert (await harness.row(message_id)).endpoint_state == {
        "orders": {"status": "Processed", "attempts": 1},
        "audit": {"status": "Pending", "attempts": 1, "error": "HTTP 503"},
    }
    (again,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    assert again.endpoint_state == state
    assert await harness.store.endpoints_tried([message_id, uuid.uuid4()]) == {
        message_id: frozenset({"orders"})
    }


async def test_a_retried_write_whose_reply_was_lost_writes_nothing_twice(
    harness: Harness,
) -> None:
    message_id = await harness.add()
    (message,) = (await harness.store.lease_batch(10, LEASE_SECONDS)).messages
    await harness.store.record_delivered([message], [sent(message)])
    again = await harness.store.record_delivered([message], [sent(message)], retrying=True)
    assert again.applied == {message_id}
    assert len(await harness.attempts(message_id)) == 1


async def test_a_breaker_counts_opens_at_the_threshold_and_closes_on_an_answer(
    harness: Harness,
) -> None:
    failed = harness.store.endpoint_failed
    cool_down = (10.0, 300.0)
    assert (
        await failed(KEY, 4, threshold=5, probe_failed=False, cool_down=cool_down, others=[])
        is None
    )
    assert await harness.breaker(KEY) == (4, 0, False)
    reopen_in = await failed(
        KEY, 1, threshold=5, probe_failed=False, cool_down=cool_down, others=[]
    )
    assert reopen_in is not None
    assert 9 < reopen_in <= 10
    assert await harness.breaker(KEY) == (5, 1, True)
    assert await harness.store.claim_probe(KEY, 5.0) is False  # still cooling down
    await harness.store.endpoint_recovered(KEY)
    assert await harness.breaker(KEY) is None


async def test_a_failed_probe_reopens_the_breaker_for_twice_as_long(harness: Harness) -> None:
    failed = harness.store.endpoint_failed
    cool_down = (10.0, 300.0)
    await failed(KEY, 5, threshold=5, probe_failed=False, cool_down=cool_down, others=[])
    await harness.cool_down_over(KEY)
    assert await harness.store.claim_probe(KEY, 5.0) is True
    assert await harness.store.claim_probe(KEY, 5.0) is False  # one probe at a time
    lease_message = await harness.add()
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    (seen,) = lease.troubled or []
    assert (seen.endpoint, seen.failures, seen.probing) == ("orders", 5, True)
    assert seen.reopen_in is not None
    assert seen.reopen_in < 0
    assert [m.message_id for m in lease.messages] == [lease_message]
    reopen_in = await failed(KEY, 1, threshold=5, probe_failed=True, cool_down=cool_down, others=[])
    assert reopen_in is not None
    assert 19 < reopen_in <= 20
    assert await harness.breaker(KEY) == (6, 2, True)


async def test_an_open_breaker_pushes_its_due_messages_to_its_reopening(harness: Harness) -> None:
    waiting = await harness.add()
    other_type = await harness.add("Unsigned")
    reopen_in = await harness.store.endpoint_failed(
        KEY, 5, threshold=5, probe_failed=False, cool_down=(10.0, 300.0), others=[]
    )
    assert reopen_in is not None
    pushed = await harness.row(waiting)
    assert pushed.due_in is not None
    assert 9 < pushed.due_in <= 10
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert [m.message_id for m in lease.messages] == [other_type]
    assert 9 < (await harness.store.next_due_in() or 0) <= 10


async def test_an_open_breaker_leaves_messages_that_wait_for_another_endpoint(
    harness: Harness,
) -> None:
    message_id = await harness.add()
    reopen_in = await harness.store.endpoint_failed(
        KEY, 5, threshold=5, probe_failed=False, cool_down=(10.0, 300.0), others=["audit"]
    )
    assert reopen_in is not None
    due_in = (await harness.row(message_id)).due_in
    assert due_in is not None
    assert due_in <= 0


async def test_a_wake_up_is_sent(harness: Harness) -> None:
    assert await harness.store.notify_wakeup() is True


async def test_the_paused_endpoints_are_read_as_keys_and_a_lease_sees_them_too(
    harness: Harness,
) -> None:
    assert await harness.store.paused_keys() == frozenset()
    await harness.pause(KEY)
    assert await harness.store.paused_keys() == frozenset({KEY})
    await harness.add()
    lease = await harness.store.lease_batch(10, LEASE_SECONDS)
    assert [(b.event_type, b.endpoint, b.paused) for b in lease.troubled or []] == [(*KEY, True)]


class Starts:
    """A relay's start (``RelayStore.start_limits``' ``start``): what it read, and what it keeps."""

    def __init__(self, *keep: OwnLimit) -> None:
        self.keep = keep
        self.read: list[LearnedLimit] = []

    def __call__(self, rows: Sequence[LearnedLimit]) -> list[OwnLimit]:
        self.read = sorted(rows, key=lambda r: r.age)
        return list(self.keep)


async def start(harness: Harness, relay: uuid.UUID, *keep: OwnLimit) -> list[LearnedLimit]:
    """What ``relay`` reads as it starts, keeping ``keep``."""
    starts = Starts(*keep)
    kept = await harness.store.start_limits(relay, [KEY], starts, live_seconds=LIVE_SECONDS)
    assert list(kept) == list(keep)
    return starts.read


LIVE_SECONDS = 150.0


async def test_a_relay_starts_from_the_limits_other_relays_keep_and_keeps_its_start(
    harness: Harness,
) -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    assert await start(harness, first) == []  # nothing learned yet
    await harness.store.save_limits(first, [OwnLimit(*KEY, 200.0, 100.0, 5.0, learned=True)])
    await harness.store.save_limits(first, [OwnLimit(*KEY, 120.0, 60.0, 2.0, learned=True)])
    (row,) = await start(harness, second, OwnLimit(*KEY, 60.0, None, None, learned=False))
    assert (row.event_type, row.endpoint, row.concurrency, row.settled) == (*KEY, 120.0, 60.0)
    assert row.learned
    assert 0 <= row.age < 5  # its own row, written over, by the store's clock
    assert row.pushed_back_ago is not None
    assert 2 <= row.pushed_back_ago < 7
    # The first relay does not read its own row; it reads the second's start, not learned.
    (start_row,) = await start(harness, first)
    assert (start_row.concurrency, start_row.learned, start_row.pushed_back_ago) == (
        60.0,
        False,
        None,
    )


async def test_a_start_forgets_the_rows_no_relay_will_read(harness: Harness) -> None:
    earlier, later, starting = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await harness.store.save_limits(earlier, [OwnLimit(*KEY, 300.0, None, None, learned=True)])
    await harness.age_limits(100)
    await harness.store.save_limits(later, [OwnLimit(*KEY, 80.0, None, None, learned=True)])
    await start(harness, starting, OwnLimit(*KEY, 80.0, None, None, learned=False))
    assert len(await start(harness, uuid.uuid4())) == 3  # all written within the last 150 s
    await harness.age_limits(200)
    # None is live: the endpoint's latest learned row is all a relay starting reads.
    (row,) = await start(harness, uuid.uuid4())
    assert (row.concurrency, row.learned) == (80.0, True)
    assert 195 < row.age < 210
    await harness.age_limits(8 * 24 * 3600)
    assert await start(harness, uuid.uuid4()) == []  # a week old: forgotten too
