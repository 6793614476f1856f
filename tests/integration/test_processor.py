"""The processor against a real PostgreSQL and a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import outbox
from outbox import store
from outbox.core.models import Attempt, Delivered, DrainSummary, Outcome, Recorded, Response, Status
from outbox.core.settings import QueueSettings
from outbox.relay.lease import messages_in_flight
from outbox.relay.processor import Deliver, OutboxProcessor, shielded
from outbox.relay.record import Recorder
from outbox.store.postgres import PostgresStore, lease_past_statement, lease_statement
from outbox.transport.wakeup import WakeUpQueue
from tests.conftest import SECRET
from tests.support.azure import connection_string, free_port
from tests.support.outbox_helpers import (
    eventually,
    open_relay,
    row,
    seed,
    statuses,
    steady_arrivals,
)
from tests.support.receiver import Receiver, Reply


async def test_delivers_a_signed_webhook_with_the_contracted_body_and_headers(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db, payload=lambda _: {"orderId": 42})
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert (summary.leased, summary.processed, summary.retried, summary.failed) == (1, 1, 0, 0)
    [request] = receiver.to("/orders")
    stored = await row(db, message_id)
    assert request.method == "POST"
    assert request.json == {
        "id": str(message_id),
        "type": "OrderCompleted",
        "timestamp": stored["created_at"].isoformat(),
        "data": {"orderId": 42},
    }
    assert request.headers["content-type"] == "application/json"
    assert request.webhook_id == str(message_id)
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 300
    assert Webhook(SECRET).verify(request.body, request.headers) == request.json
    assert stored["status"] == "Processed"
    assert stored["processed_at"] is not None
    assert stored["last_error"] is None
    assert stored["attempt_count"] == 1
    assert stored["lease_expires_at"] is None


async def test_signature_fails_after_tampering_with_body_id_or_timestamp(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await seed(db)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    [request] = receiver.requests
    tampered = [
        (request.body.replace(b'"orderId": 0', b'"orderId": 1'), request.headers),
        (request.body, {**request.headers, "webhook-id": "another-id"}),
        (
            request.body,
            {
                **request.headers,
                "webhook-timestamp": str(int(request.headers["webhook-timestamp"]) - 1),
            },
        ),
    ]
    for body, headers in tampered:
        with pytest.raises(WebhookVerificationError):
            Webhook(SECRET).verify(body, headers)


async def test_endpoint_without_secret_gets_no_signature(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await seed(db, event_type="Unsigned")
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    [request] = receiver.to("/unsigned")
    assert "webhook-signature" not in request.headers
    assert request.headers["webhook-id"]


async def test_5xx_goes_back_to_pending_after_the_first_backoff_step(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(503, b"upstream\ndown"))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert (summary.processed, summary.retried, summary.failed) == (0, 1, 0)
    stored = await row(db, message_id)
    assert stored["status"] == "Pending"
    assert stored["attempt_count"] == 1
    assert stored["last_error"] == "HTTP 503: upstream down"
    assert 8.5 <= stored["due_in"] <= 10.0  # 10 s, less up to 10% jitter
    assert stored["processed_at"] is None


async def test_429_honours_retry_after(db: Any, receiver: Receiver, make_settings: Any) -> None:
    receiver.script("/orders", Reply(429, b"slow down", headers={"Retry-After": "120"}))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    stored = await row(db, message_id)
    assert stored["status"] == "Pending"
    assert 118 <= stored["due_in"] <= 120
    assert stored["last_error"] == "HTTP 429: slow down"


async def test_410_fails_at_once_and_keeps_the_row(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(410, b"gone"))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.failed == 1
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Failed", 1)
    assert stored["last_error"] == "HTTP 410: gone"
    assert stored["processed_at"] is None


async def test_redirects_are_not_followed_but_retried(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(302, headers={"Location": receiver.url("/elsewhere")}))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    assert receiver.to("/elsewhere") == []
    stored = await row(db, message_id)
    # Retried (a redirect is usually a moved endpoint, which a changed URL fixes), never followed.
    assert stored["status"] == "Pending"
    assert stored["last_error"].startswith("HTTP 302")
    assert "update the endpoint's URL" in stored["last_error"]


async def test_unknown_event_type_fails_without_a_request(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db, event_type="InvoicePaid")
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    assert receiver.requests == []
    stored = await row(db, message_id)
    assert stored["status"] == "Failed"
    assert stored["last_error"] == (
        "no endpoint configured for event type 'InvoicePaid' (OUTBOX_WEBHOOKS)"
    )


async def test_connection_refused_is_retried_and_the_url_stays_out_of_last_error(
    db: Any, make_settings: Any
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hooks/capability-token-123"
    [message_id] = await seed(db)
    async with open_relay(make_settings(webhooks={"OrderCompleted": {"url": url}})) as relay:
        summary = await relay.processor.execute()
    assert summary.retried == 1
    stored = await row(db, message_id)
    assert stored["status"] == "Pending"
    assert stored["last_error"].startswith("ClientConnectorError: Cannot connect to host 127.0.0.1")
    assert "capability-token-123" not in stored["last_error"]


async def test_timeout_is_retried(db: Any, receiver: Receiver, make_settings: Any) -> None:
    release = asyncio.Event()
    receiver.script("/orders", Reply(200, hold=release))
    [message_id] = await seed(db)
    try:
        async with open_relay(make_settings(http_timeout_seconds=0.5)) as relay:
            summary = await relay.processor.execute()
    finally:
        release.set()
    assert summary.retried == 1
    stored = await row(db, message_id)
    assert (stored["status"], stored["last_error"]) == ("Pending", "timed out after 0.5s")


async def test_the_last_allowed_attempt_fails_the_message(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", then=Reply(500, b"still broken"))
    [message_id] = await seed(db)
    await db.execute("UPDATE outbox_messages SET attempt_count = 2")
    async with open_relay(make_settings(max_attempts=3)) as relay:
        summary = await relay.processor.execute()
    assert summary.failed == 1
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Failed", 3)
    assert stored["last_error"] == "gave up after 3 attempts: HTTP 500: still broken"


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ("null", "payload is JSON null, not an object"),
        ("[1, 2]", "payload is JSON array, not an object"),
        ('"text"', "payload is JSON string, not an object"),
        (json.dumps({"blob": "x" * 2000}), "above OUTBOX_MAX_PAYLOAD_BYTES=1024"),
    ],
)
async def test_unsendable_rows_written_by_hand_fail_with_a_reason(
    db: Any, receiver: Receiver, make_settings: Any, payload: str, error: str
) -> None:
    message_id = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "VALUES (gen_random_uuid(), 'OrderCompleted', $1::jsonb) RETURNING outbox_message_id",
        payload,
    )
    async with open_relay(make_settings(max_payload_bytes=1024)) as relay:
        await relay.processor.execute()
    assert receiver.requests == []
    stored = await row(db, message_id)
    assert stored["status"] == "Failed"
    assert error in stored["last_error"]


async def test_drains_batch_after_batch_until_nothing_is_due(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 35)
    async with open_relay(make_settings(batch_size=10)) as relay:
        summary = await relay.processor.execute()
    assert (summary.leased, summary.processed, summary.batches) == (35, 35, 4)
    assert sorted(r.webhook_id for r in receiver.requests) == sorted(map(str, ids))
    assert await statuses(db) == {"Processed": 35}


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "a key each"])
async def test_a_hint_s_run_ends_once_caught_up_although_rows_keep_arriving(
    db: Any, receiver: Receiver, make_settings: Any, database_url: str, keyed: bool
) -> None:
    # Rows arrive faster than a lease and its deliveries take, so every lease finds some: a run
    # that leased until one came back empty would last its whole budget, while the hints of
    # these rows queued up behind it.
    receiver.script("/orders", then=Reply(200, delay=0.05))
    async with steady_arrivals(database_url, keyed=keyed):
        await eventually(lambda: _some_rows(db))
        async with open_relay(make_settings()) as relay:
            caught_up = await relay.processor.execute(budget_seconds=20, until_caught_up=True)
    assert caught_up.stopped_by == "drained"
    assert caught_up.processed == caught_up.leased >= 1
    # What arrived later is still there for the next hint's run (or the timer's).
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    assert set(await statuses(db)) == {"Processed"}


async def test_a_hint_s_run_follows_an_ordering_key_to_its_end(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # The next message with a key becomes due only when the one before it is done; its own hint
    # may have been taken while it was held back, so the run that held the key goes on.
    async with db.transaction():
        keyed = [
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key="order-1")
            for n in range(3)
        ]
        await outbox.enqueue(db, "OrderCompleted", {"n": "free"})
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute(until_caught_up=True)
    assert (summary.processed, summary.stopped_by) == (4, "drained")
    order = [r.webhook_id for r in receiver.requests if r.webhook_id in map(str, keyed)]
    assert order == [str(i) for i in keyed]


async def test_a_hint_s_run_does_not_lease_again_once_caught_up(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await seed(db, 25)
    settings = make_settings(batch_size=10)
    async with open_relay(settings) as relay:
        pool = CountingPool(relay.pool)
        processor = OutboxProcessor(PostgresStore(pool), relay.publisher.deliver, settings)
        summary = await processor.execute(until_caught_up=True)
    assert (summary.processed, summary.stopped_by) == (25, "drained")
    # 10, 10, 5: the short lease ends the run without one more that would find nothing.
    assert [name for name, _ in pool.calls].count("lease_batch") == 3


async def test_concurrency_bounds_requests_in_flight(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    await seed(db, 12)
    async with open_relay(make_settings(concurrency=3)) as relay:
        drain = asyncio.create_task(relay.processor.execute())
        await eventually(lambda: receiver.in_flight == 3)
        release.set()
        summary = await drain
    assert summary.processed == 12
    assert receiver.max_in_flight == 3


async def _some_rows(db: Any) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM outbox_messages"))


# The two statements that write a batch's outcomes: any batch, and a batch all delivered.
OUTCOME_WRITES = ("record_outcomes", "record_delivered")


def statement_name(query: str) -> str:
    """The name of a statement the relay ran; its usual lease has its batch size written in
    (``postgres.lease_statement``)."""
    for name, statement in store.QUERIES.items():
        if statement == query:
            return name
    if query == lease_past_statement():
        return "lease_past"
    size = re.search(r"LIMIT (\d+)\n\)", query)
    assert size is not None, query
    assert query == lease_statement(int(size[1])), query
    return "lease_batch"


class CountingPool:
    """A pool that counts the statements it runs, by name (outcome writes with their size)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.calls: list[tuple[str, int]] = []

    def _count(self, query: str, args: tuple[Any, ...]) -> None:
        name = statement_name(query)
        self.calls.append((name, len(args[0]) if name in OUTCOME_WRITES else 0))

    async def fetch(self, query: str, *args: Any) -> Any:
        self._count(query, args)
        return await self._pool.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        self._count(query, args)
        return await self._pool.fetchrow(query, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)  # execute, fetchval: not counted


async def test_outcomes_of_a_batch_are_written_in_one_statement(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", *[Reply(500)] * 5)  # a mix of outcomes in the first batch
    await seed(db, 25)
    settings = make_settings(batch_size=10)
    async with open_relay(settings) as relay:
        pool = CountingPool(relay.pool)
        processor = OutboxProcessor(PostgresStore(pool), relay.publisher.deliver, settings)
        summary = await processor.execute()
    assert (summary.processed, summary.retried) == (20, 5)
    writes = [(name, size) for name, size in pool.calls if name in OUTCOME_WRITES]
    # The batch with retries through the general statement, the ones all delivered the lean one.
    assert sorted(writes) == [
        ("record_delivered", 5),
        ("record_delivered", 10),
        ("record_outcomes", 10),
    ]
    assert [name for name, _ in pool.calls].count("lease_batch") == 4  # the last one finds nothing


async def drain_with_delivery(settings: Any, wrap: Callable[[Deliver], Deliver]) -> DrainSummary:
    """One run of a processor whose delivery a test wraps, to inject a fault at that edge."""
    async with open_relay(settings) as relay:
        publish = relay.publisher.deliver
        processor = OutboxProcessor(relay.store, wrap(publish), settings)
        return await asyncio.wait_for(processor.execute(), 60)  # a guard against a hang


def raising_for(message_id: Any, error: BaseException) -> Callable[[Deliver], Deliver]:
    """A delivery wrapper that raises ``error`` for one message and delivers the others."""

    def wrap(publish: Deliver) -> Deliver:
        async def deliver(message: Any, endpoint: Any) -> Any:
            if message.message_id == message_id:
                raise error
            return await publish(message, endpoint)

        return deliver

    return wrap


async def test_a_batch_all_delivered_is_written_as_the_general_statement_writes_it(
    db: Any,
) -> None:
    # The lean statement (record_delivered) must leave the very rows record_outcomes would.
    ids = await seed(db, 2, payload=lambda _: {"same": True})
    lease = await PostgresStore(db).lease_batch(10, 30.0)
    general, lean = sorted(lease.messages, key=lambda m: ids.index(m.message_id))
    started = time.time()
    outcome = Outcome(Status.PROCESSED)
    attempt = Delivered("OrderCompleted", 1, Attempt(Response(204), started, 12), outcome)
    await PostgresStore(db).record_outcomes([Recorded(general, outcome, (attempt,))])
    sent = store.SentAttempt(lean.message_id, "OrderCompleted", 1, started, 12, 204)
    written = await PostgresStore(db).record_delivered([lean], [sent])
    assert written == store.Written({lean.message_id}, lets_next_go=False)

    async def written_for(message_id: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        message = dict(await row(db, message_id))
        history = dict(
            await db.fetchrow(
                "SELECT * FROM outbox_attempts WHERE outbox_message_id = $1", message_id
            )
        )
        assert message["processed_at"] is not None
        # What differs between any two messages, or between two statements' now().
        for key in ("outbox_message_id", "created_at", "lease_token", "processed_at", "due_in"):
            del message[key]
        for key in ("attempt_id", "outbox_message_id", "lease_token", "recorded_at"):
            del history[key]
        return message, history

    assert await written_for(ids[1]) == await written_for(ids[0])
    assert (await row(db, ids[1]))["status"] == "Processed"


async def test_a_2xx_answer_with_a_snippet_keeps_it_in_the_history(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # A delivery of the application's own (not the bundled publisher) may keep a 2xx answer's
    # text: the batch is then written by the general statement, which keeps it.
    [message_id] = await seed(db)

    def wrap(publish: Deliver) -> Deliver:
        async def deliver(message: Any, endpoint: Any) -> Any:
            answered = await publish(message, endpoint)
            return Response(answered.status, snippet="accepted as #7")

        return deliver

    summary = await drain_with_delivery(make_settings(), wrap)
    assert summary.processed == 1
    history = await db.fetchrow(
        "SELECT http_status, response_snippet FROM outbox_attempts WHERE outbox_message_id = $1",
        message_id,
    )
    assert (history["http_status"], history["response_snippet"]) == (200, "accepted as #7")


def is_outcome_write(query: str) -> bool:
    return query in (store.QUERIES[name] for name in OUTCOME_WRITES)


class LostReplyPool:
    """A pool whose first outcome write commits, but whose reply is lost on the way back."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.lost: str | None = None  # the statement whose reply was lost

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return self._lose(query, await self._pool.fetchrow(query, *args))

    async def fetch(self, query: str, *args: Any) -> Any:
        return self._lose(query, await self._pool.fetch(query, *args))

    def _lose(self, query: str, result: Any) -> Any:
        if is_outcome_write(query) and not self.lost:
            self.lost = next(n for n in OUTCOME_WRITES if store.QUERIES[n] == query)
            raise ConnectionResetError("connection lost before the reply arrived")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)  # execute (the breakers' writes)


@pytest.mark.parametrize(
    ("replies", "statement"),
    [([], "record_delivered"), ([Reply(500)], "record_outcomes")],
    ids=["all-delivered", "with-a-retry"],
)
async def test_an_outcome_write_retried_after_its_lost_reply_counts_and_records_once(
    db: Any, receiver: Receiver, make_settings: Any, replies: list[Reply], statement: str
) -> None:
    receiver.script("/orders", *replies)
    ids = await seed(db, 3)
    settings = make_settings()
    async with open_relay(settings) as relay:
        pool = LostReplyPool(relay.pool)
        processor = OutboxProcessor(PostgresStore(pool), relay.publisher.deliver, settings)
        summary = await processor.execute()
    assert pool.lost == statement
    assert (summary.processed + summary.retried, summary.stale, summary.unrecorded) == (3, 0, 0)
    assert summary.retried == len(replies)
    assert sum((await statuses(db)).values()) == 3
    history = await db.fetch("SELECT outbox_message_id, applied FROM outbox_attempts")
    assert sorted((r["outbox_message_id"], r["applied"]) for r in history) == sorted(
        (i, True) for i in ids
    )


class FailingWritesPool:
    """A pool whose outcome writes fail with ``error`` (by default a PostgreSQL error)."""

    def __init__(self, pool: Any, error: Exception | None = None) -> None:
        self._pool = pool
        self.leases = 0
        self.error = error or asyncpg.exceptions.DiskFullError("could not extend file")

    async def fetchrow(self, query: str, *args: Any) -> Any:
        if is_outcome_write(query):
            raise self.error
        return await self._pool.fetchrow(query, *args)

    async def fetch(self, query: str, *args: Any) -> Any:
        if is_outcome_write(query):
            raise self.error
        self.leases += statement_name(query) == "lease_batch"
        return await self._pool.fetch(query, *args)


@pytest.mark.parametrize(
    ("error", "reported"),
    [
        (None, "database error: DiskFullError"),
        (RuntimeError(f"a bug, with {SECRET}"), "outcome write failed: RuntimeError: a bug"),
    ],
    ids=["database", "bug"],
)
async def test_an_outcome_write_that_fails_ends_the_run(
    db: Any, receiver: Receiver, make_settings: Any, error: Exception | None, reported: str
) -> None:
    # Leasing more would only leave more rows Processing until their leases expire.
    await seed(db, 100)
    # Five slots: batches of five, twice as many open as in flight (``lease.messages_in_flight``).
    settings = make_settings(batch_size=5, concurrency=5)
    open_messages = 2 * messages_in_flight(5, 5)
    assert open_messages <= 50
    async with open_relay(settings) as relay:
        pool = FailingWritesPool(relay.pool, error)
        processor = OutboxProcessor(PostgresStore(pool), relay.publisher.deliver, settings)
        summary = await processor.execute()
    assert summary.stopped_by == "error"
    assert (summary.error or "").startswith(reported)
    assert SECRET not in (summary.error or "")
    # What was leased when the first write failed, and no more: at most the batches open then.
    assert summary.leased == summary.unrecorded <= open_messages
    assert pool.leases <= open_messages // 5
    assert (await statuses(db))["Pending"] >= 100 - open_messages


async def test_an_exception_escaping_a_delivery_is_recorded_and_the_rest_still_delivered(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 5)

    faulty = raising_for(ids[1], RuntimeError(f"bug while sending with {SECRET}"))
    summary = await drain_with_delivery(make_settings(concurrency=2), faulty)
    # The delivery loop that met the exception went on: every other message was delivered.
    assert (summary.processed, summary.retried) == (4, 1)
    assert sorted(r.webhook_id for r in receiver.to("/orders")) == sorted(
        str(i) for i in ids if i != ids[1]
    )
    broken = await row(db, ids[1])
    assert (broken["status"], broken["attempt_count"]) == ("Pending", 1)
    assert broken["last_error"].startswith("unexpected RuntimeError: bug while sending with ")
    assert SECRET not in broken["last_error"]


async def test_a_batch_that_fails_outside_its_deliveries_is_logged_without_secrets(
    db: Any, receiver: Receiver, make_settings: Any, monkeypatch: Any, caplog: Any
) -> None:
    await seed(db, 3)

    def broken(*_: Any) -> Any:
        raise RuntimeError(f"a bug while deciding an outcome, near {SECRET}")

    # No input is known to get here; a bug would, and its text may quote a secret.
    monkeypatch.setattr(Recorder, "record", broken)
    settings = make_settings()
    async with open_relay(settings) as relay:
        processor = OutboxProcessor(relay.store, relay.publisher.deliver, settings)
        await asyncio.wait_for(processor.execute(), 60)
    logged = [r.getMessage() for r in caplog.records if "batch failed" in r.getMessage()]
    assert logged
    assert logged[0].startswith("outbox batch failed: RuntimeError: a bug while deciding")
    assert SECRET not in caplog.text


async def test_a_result_that_cannot_be_classified_is_retried_and_the_batch_still_recorded(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 5)

    def odd(publish: Deliver) -> Deliver:
        async def deliver(message: Any, endpoint: Any) -> Any:
            result = await publish(message, endpoint)
            # An answer nobody foresaw: deciding its outcome raises (here: not a result at all).
            return f"odd answer {SECRET}" if message.message_id == ids[2] else result

        return deliver

    summary = await drain_with_delivery(make_settings(), odd)
    assert (summary.processed, summary.retried, summary.unrecorded) == (4, 1, 0)
    odd = await row(db, ids[2])
    assert (odd["status"], odd["attempt_count"]) == ("Pending", 1)
    assert odd["last_error"].startswith("unexpected TypeError: not a delivery result")
    assert SECRET not in odd["last_error"]
    history = await db.fetchrow(
        "SELECT outcome, error_class FROM outbox_attempts WHERE outbox_message_id = $1", ids[2]
    )
    assert tuple(history) == ("Pending", "TypeError")


async def test_an_expired_lease_is_released_to_another_worker(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db)
    # A worker leases the row for half a second and dies without recording anything.
    [leased] = (await PostgresStore(db).lease_batch(10, 0.5)).messages
    await eventually(lambda: db.fetchval("SELECT lease_expires_at <= now() FROM outbox_messages"))
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 2)
    assert stored["lease_token"] != leased.lease_token


async def test_a_valid_lease_is_not_taken_by_another_worker(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db)
    await PostgresStore(db).lease_batch(10, 60)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.leased == 0
    assert receiver.requests == []
    assert (await row(db, message_id))["status"] == "Processing"


async def test_two_processors_draining_at_once_never_deliver_a_row_twice(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 300)
    settings = make_settings(batch_size=20)
    async with open_relay(settings) as first, open_relay(settings) as second:
        a, b = await asyncio.gather(first.processor.execute(), second.processor.execute())
    assert a.leased + b.leased == 300
    assert a.processed + b.processed == 300
    hits = Counter(r.webhook_id for r in receiver.requests)
    assert set(hits) == set(map(str, ids))
    assert set(hits.values()) == {1}


async def test_a_stale_worker_cannot_overwrite_the_newer_outcome(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    slow = asyncio.Event()
    # The first worker's request hangs, then fails; the second worker's succeeds.
    receiver.script("/orders", Reply(500, b"late failure", hold=slow), Reply(200))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as first, open_relay(make_settings()) as second:
        stale = asyncio.create_task(first.processor.execute())
        await receiver.wait_for(1)
        # The first worker's lease runs out while its request is still in flight.
        await db.execute(
            "UPDATE outbox_messages SET lease_expires_at = now(), next_attempt_at = now()"
        )
        fresh = await second.processor.execute()
        slow.set()
        late = await stale
    assert (fresh.processed, late.stale, late.retried) == (1, 1, 0)
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 2)
    assert stored["last_error"] is None


async def test_a_stale_outcome_for_a_deleted_message_does_not_sink_the_batch(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    slow = asyncio.Event()
    # The first worker holds two messages; its request for one of them hangs.
    receiver.script("/orders", Reply(200), Reply(200, hold=slow), Reply(200))
    ids = await seed(db, 2)
    async with open_relay(make_settings()) as first, open_relay(make_settings()) as second:
        stale = asyncio.create_task(first.processor.execute())
        await receiver.wait_for(2)
        hung = next(i for i in ids if str(i) == receiver.requests[1].webhook_id)
        # Its lease on that message runs out; another worker delivers it, and it is purged (or
        # deleted by hand) before the first worker writes its outcomes.
        await db.execute(
            "UPDATE outbox_messages SET lease_expires_at = now(), next_attempt_at = now() "
            "WHERE outbox_message_id = $1",
            hung,
        )
        assert (await second.processor.execute()).processed == 1
        await db.execute("DELETE FROM outbox_messages WHERE outbox_message_id = $1", hung)
        slow.set()
        late = await stale
    # The stale attempt has no message to belong to; the other outcome is still written.
    assert (late.processed, late.stale, late.unrecorded, late.error) == (1, 1, 0, None)
    [other] = [i for i in ids if i != hung]
    assert (await row(db, other))["status"] == "Processed"
    # No attempt outlives its message: the late worker's one for the deleted message is dropped.
    attempts = await db.fetch("SELECT outbox_message_id FROM outbox_attempts")
    assert [r["outbox_message_id"] for r in attempts] == [other]


@pytest.mark.parametrize("until_caught_up", [False, True], ids=["drain", "hint's run"])
async def test_stop_finishes_in_flight_deliveries_and_releases_the_rest(
    db: Any, receiver: Receiver, make_settings: Any, until_caught_up: bool
) -> None:
    release = asyncio.Event()
    receiver.script("/orders", Reply(200, hold=release))
    await seed(db, 5)
    async with open_relay(make_settings(concurrency=1)) as relay:
        drain = asyncio.create_task(relay.processor.execute(until_caught_up=until_caught_up))
        await receiver.wait_for(1)
        relay.processor.stop()
        release.set()
        summary = await drain
    assert (summary.processed, summary.released, summary.stopped_by) == (1, 4, "stopped")
    assert len(receiver.requests) == 1
    assert await statuses(db) == {"Processed": 1, "Pending": 4}
    released = await db.fetch("SELECT * FROM outbox_messages WHERE status = 'Pending'")
    assert {(r["attempt_count"], r["last_error"]) for r in released} == {(0, None)}
    assert await db.fetchval(
        "SELECT bool_and(next_attempt_at <= now()) FROM outbox_messages WHERE status = 'Pending'"
    )


async def cancel_once_requests_arrived(
    settings: Any, receiver: Receiver, count: int, release: asyncio.Event
) -> None:
    """Run a drain and cancel it, as the host would, once ``count`` requests have arrived; then
    let the receiver answer what it holds (``release``)."""
    try:
        async with open_relay(settings) as relay:
            drain = asyncio.create_task(relay.processor.execute())
            await receiver.wait_for(count)
            drain.cancel()
            with pytest.raises(asyncio.CancelledError):
                await drain
    finally:
        release.set()


async def test_a_cancelled_run_still_records_its_outcomes(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    release = asyncio.Event()
    receiver.script("/orders", Reply(200), Reply(200, hold=release))
    await seed(db, 2)
    await cancel_once_requests_arrived(make_settings(concurrency=1), receiver, 2, release)
    assert await statuses(db) == {"Processed": 1, "Pending": 1}
    interrupted = await db.fetchrow("SELECT * FROM outbox_messages WHERE status = 'Pending'")
    assert interrupted["last_error"] == "delivery interrupted before it completed"
    assert interrupted["attempt_count"] == 1


async def test_a_cancelled_run_releases_what_it_never_sent_without_counting_it(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    release = asyncio.Event()
    receiver.script("/orders", Reply(200, hold=release))
    ids = await seed(db, 4)
    settings = make_settings(concurrency=1, max_attempts=1)
    await cancel_once_requests_arrived(settings, receiver, 1, release)
    sent = receiver.requests[0].webhook_id
    stored = {str(i): await row(db, i) for i in ids}
    # The one request that went out counts (it may have arrived): its last allowed attempt.
    assert stored[sent]["status"] == "Failed"
    # The three never sent are given back as they were: due now, no attempt, no history.
    unsent = [r for key, r in stored.items() if key != sent]
    assert {(r["status"], r["attempt_count"], r["last_error"]) for r in unsent} == {
        ("Pending", 0, None)
    }
    assert all(r["due_in"] <= 0 for r in unsent)
    assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 1


async def test_a_run_cancelled_while_it_finishes_leaves_no_delivery_running(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Batches of four, two requests at a time: the first request is held, the others take 1 s
    # each. The 3 s budget ends once the first batch is under way, what the next lease took and
    # could not start is given back, and the run is finishing (waiting for the held request)
    # when the host cancels it.
    hold = asyncio.Event()
    receiver.script("/orders", Reply(200, hold=hold), then=Reply(200, delay=1.0))
    await seed(db, 8)
    async with open_relay(make_settings(concurrency=2, batch_size=4)) as relay:
        drain = asyncio.create_task(relay.processor.execute(budget_seconds=3.0))
        await eventually(lambda: _released(db, 1))  # the budget is spent
        assert receiver.in_flight == 1  # still held: the run is finishing
        drain.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drain
        loops = [t for t in asyncio.all_tasks() if "_deliver_loop" in repr(t.get_coro())]
        assert loops == []
        seen = len(receiver.requests)
        hold.set()
        await asyncio.sleep(1.5)  # long enough for another request, if anything still sent
        assert len(receiver.requests) == seen
    counts = await statuses(db)
    assert counts["Processed"] >= 2
    assert counts["Processed"] + counts["Pending"] == 8
    unsent = await db.fetchval(
        "SELECT count(*) FROM outbox_messages WHERE status = 'Pending' AND attempt_count = 0"
    )
    assert unsent == 8 - seen


@pytest.mark.parametrize("until_caught_up", [False, True], ids=["drain", "hint's run"])
async def test_no_delivery_starts_after_the_budget_whatever_the_lease(
    db: Any, receiver: Receiver, make_settings: Any, until_caught_up: bool
) -> None:
    # One request at a time, 0.4 s each, a 60 s lease: the budget, not the lease, bounds the run.
    receiver.script("/orders", then=Reply(200, delay=0.4))
    await seed(db, 10)
    async with open_relay(make_settings(concurrency=1, lease_seconds=60)) as relay:
        summary = await relay.processor.execute(budget_seconds=0.5, until_caught_up=until_caught_up)
    assert summary.stopped_by == "budget"
    assert summary.released == 10 - summary.processed >= 1
    assert len(receiver.requests) == summary.processed
    given_back = await db.fetch(
        "SELECT attempt_count, last_error, next_attempt_at <= now() AS due "
        "FROM outbox_messages WHERE status = 'Pending'"
    )
    assert len(given_back) == summary.released
    assert all((r["attempt_count"], r["due"]) == (0, True) for r in given_back)


async def test_a_run_s_unsent_messages_do_not_wait_behind_another_run_s_requests(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # One processor, one slot, shared by two runs (as the queue, timer and HTTP functions of one
    # worker share it). The long run's first requests are quick, then one takes 2 s and the
    # rest 0.3 s each. The short run leases what the slot could start at the quick pace; once
    # its budget is spent, its unsent messages are given back together, not each after one of
    # the long run's requests.
    receiver.script("/orders", *[Reply(200)] * 3, Reply(200, delay=2.0), then=Reply(200, delay=0.3))
    await seed(db, 10)
    async with open_relay(make_settings(concurrency=1, batch_size=5)) as relay:
        long_run = asyncio.create_task(relay.processor.execute())
        await eventually(lambda: receiver.in_flight == 1 and len(receiver.requests) == 4)
        await seed(db, 5)
        short = await relay.processor.execute(budget_seconds=0.2)
        sent_meanwhile = len(receiver.requests)
        await long_run
    assert short.stopped_by == "budget"
    assert short.released == short.leased >= 1
    # The slow request in flight when the short run's budget ended, and at most one after it.
    assert sent_meanwhile <= 5


async def test_a_run_leases_no_more_than_the_shared_slots_can_start_within_its_budget(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # The long run keeps the one slot busy at 0.3 s a request: a run with a 0.2 s budget
    # beside it leases nothing it could not start, so it has nothing to give back.
    receiver.script("/orders", then=Reply(200, delay=0.3))
    await seed(db, 10)
    async with open_relay(make_settings(concurrency=1, batch_size=5)) as relay:
        long_run = asyncio.create_task(relay.processor.execute())
        await receiver.wait_for(2)  # the pace of a request is known
        await seed(db, 5)
        short = await relay.processor.execute(budget_seconds=0.2)
        await long_run
    assert short.stopped_by == "budget"
    assert (short.leased, short.released) == (0, 0)
    assert await statuses(db) == {"Processed": 15}


async def test_a_hint_s_run_leases_again_what_it_gave_back(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # A slow receiver and a short lease: later messages of each batch are given back (their
    # lease would end before a request could time out). They are due now, and the hint that
    # announced them is used up, so the run must take them itself.
    receiver.script("/orders", then=Reply(200, delay=0.8))
    await seed(db, 6)
    settings = make_settings(concurrency=1, batch_size=4, lease_seconds=5, http_timeout_seconds=2)
    async with open_relay(settings) as relay:
        summary = await relay.processor.execute(until_caught_up=True)
    assert summary.released >= 1
    assert (summary.processed, summary.stopped_by) == (6, "drained")
    assert await statuses(db) == {"Processed": 6}


async def test_a_hint_s_run_that_caught_up_reports_drained_although_its_budget_ran_out(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Its one delivery outlasts the budget, but nothing was given back or left: it drained.
    receiver.script("/orders", Reply(200, delay=1.0))
    await seed(db, 1)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute(budget_seconds=0.5, until_caught_up=True)
    assert (summary.processed, summary.released, summary.stopped_by) == (1, 0, "drained")


async def _released(db: Any, count: int) -> bool:
    """Whether ``count`` rows were leased and then given back without an attempt."""
    released = await db.fetchval(
        "SELECT count(*) FROM outbox_messages "
        "WHERE status = 'Pending' AND attempt_count = 0 AND lease_token IS NOT NULL"
    )
    return bool(released >= count)


async def test_a_cancelled_error_raised_by_a_delivery_is_that_message_s_outcome(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 5)

    # Raised from inside a library, not a cancellation of the run.
    cancelling = raising_for(ids[1], asyncio.CancelledError())
    summary = await drain_with_delivery(make_settings(concurrency=1), cancelling)
    assert (summary.processed, summary.retried) == (4, 1)
    assert (await row(db, ids[1]))["last_error"].startswith("unexpected CancelledError")


async def test_shielded_write_completes_although_the_caller_is_cancelled(db: Any) -> None:
    await db.execute("CREATE TABLE marks (n int)")
    started = asyncio.Event()

    async def slow_write() -> None:
        started.set()
        await db.execute("SELECT pg_sleep(0.3)")
        await db.execute("INSERT INTO marks VALUES (1)")

    caller = asyncio.create_task(shielded(slow_write()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await db.fetchval("SELECT count(*) FROM marks") == 1


async def test_a_spent_budget_leases_nothing(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await seed(db, 3)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute(budget_seconds=1e-9)
    assert (summary.leased, summary.stopped_by) == (0, "budget")
    assert await statuses(db) == {"Pending": 3}


async def test_a_lost_hint_is_delivered_by_the_next_drain(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db)
    broken = QueueSettings.load(queue_connection=connection_string(free_port()))
    async with WakeUpQueue.from_settings(broken) as queue:
        assert await queue.notify() is False
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    assert receiver.to("/orders")[0].webhook_id == str(message_id)


async def test_connections_are_kept_alive_across_deliveries(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    await seed(db, 20)
    async with open_relay(make_settings(concurrency=2)) as relay:
        await relay.processor.execute()
    assert len(receiver.requests) == 20
    # Twenty deliveries over at most two TCP connections: one per concurrent slot.
    assert len({r.peer for r in receiver.requests}) <= 2
