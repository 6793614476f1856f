"""A dead or failing endpoint: its circuit breaker opens for every relay, its messages wait
without spending attempts, and it never holds up a healthy endpoint."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import asyncpg
import pytest

from outbox import store
from outbox.relay.breaker_store import BreakerWriter
from outbox.relay.breakers import PROBE, THRESHOLD
from tests.support.outbox_helpers import eventually, open_relay, run_cli, seed, seed_many, statuses
from tests.support.raw_server import RawServer
from tests.support.receiver import Received, Receiver, Reply
from tests.support.relay_process import relay_env, run_relay


async def breaker(db: Any) -> Any:
    return await db.fetchrow(
        "SELECT consecutive_failures, opens, extract(epoch FROM reopen_at - now()) AS reopen_in "
        "FROM outbox_endpoints WHERE event_type = 'Flaky' AND endpoint = 'Flaky'"
    )


async def cool_down_over(db: Any) -> None:
    """As if the cool-down had passed, and the messages it held were due again."""
    await db.execute("UPDATE outbox_endpoints SET reopen_at = now()")
    await db.execute("UPDATE outbox_messages SET next_attempt_at = now() WHERE status = 'Pending'")


@pytest.mark.slow
async def test_a_breaker_opens_for_every_relay_process_is_probed_once_and_closes(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    healthy = False
    receiver.responder = lambda _: Reply(200 if healthy else 503, b"down")
    await seed_many(db, 30, event_type="Flaky")
    env = relay_env(
        database_url, {"Flaky": {"url": receiver.url("/flaky")}}, concurrency=4, batch_size=30
    )

    first = await run_relay(env)  # relay A
    assert first.returncode == 0, first.stderr
    sent = len(receiver.requests)
    assert 10 <= sent <= 14  # ten failures in a row open it (and what was already in flight)
    state = await breaker(db)
    assert (state["opens"], state["consecutive_failures"] >= 10) == (1, True)
    assert 5 < state["reopen_in"] <= 10
    counts = await statuses(db)
    assert counts == {"Pending": 30}  # none failed by the breaker
    unspent = await db.fetchval("SELECT count(*) FROM outbox_messages WHERE attempt_count = 0")
    assert unspent == 30 - sent  # held ones spent no attempt

    # Relay B, another process, learns it from the database: a new message waits too.
    await seed_many(db, 1, event_type="Flaky")
    second = await run_relay(env)
    assert second.returncode == 0, second.stderr
    assert len(receiver.requests) == sent
    held = await db.fetchrow(
        "SELECT attempt_count, extract(epoch FROM next_attempt_at - now()) AS due_in "
        "FROM outbox_messages ORDER BY created_at DESC LIMIT 1"
    )
    assert held["attempt_count"] == 0
    assert 0 < held["due_in"] <= 10

    # Cool-down over: one probe; it fails, and the breaker opens again, for twice as long.
    await cool_down_over(db)
    probed = await run_relay(env)
    assert probed.returncode == 0, probed.stderr
    assert len(receiver.requests) == sent + 1
    state = await breaker(db)
    assert state["opens"] == 2
    assert 15 < state["reopen_in"] <= 20

    # The endpoint is back: the next probe succeeds, the breaker closes, everything is sent.
    healthy = True
    await cool_down_over(db)
    recovered = await run_relay(env)
    assert recovered.returncode == 0, recovered.stderr
    assert await statuses(db) == {"Processed": 31}
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints") == 0


async def never_answer(writer: asyncio.StreamWriter, server: RawServer) -> None:
    await asyncio.Event().wait()  # accepts the connection, reads the request, says nothing


@pytest.mark.slow
async def test_a_dead_endpoint_never_holds_up_a_healthy_one(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    dead = await RawServer(never_answer).start()
    try:
        await seed_many(db, 1000, event_type="Dead")  # before the healthy ones: leased first
        await seed_many(db, 200, event_type="OrderCompleted")
        webhooks = {
            "Dead": {"url": dead.url("/never")},
            "OrderCompleted": {"url": receiver.url("/orders")},
        }
        # Sixteen slots, all of which an endpoint starts with (``limits.INITIAL_LIMIT``).
        settings = make_settings(webhooks=webhooks, http_timeout_seconds=3, concurrency=16)
        delivered_at: list[float] = []
        receiver.responder = lambda request: _noting(delivered_at, request)
        async with open_relay(settings) as relay:
            started = time.monotonic()
            summary = await relay.processor.execute(budget_seconds=20)
    finally:
        await dead.stop()
    assert len(delivered_at) == 200
    assert max(delivered_at) - started <= 12  # alone they take under a second
    # The dead endpoint got what was in flight, what replaced the failures before the tenth
    # (the breaker is closed until then), and one probe after the cool-down; no more.
    assert settings.concurrency <= dead.requests <= settings.concurrency + THRESHOLD
    assert summary.failed == 0
    counts = await statuses(db)
    assert counts == {"Processed": 200, "Pending": 1000}


def _noting(times: list[float], request: Received) -> Reply:
    times.append(time.monotonic())
    return Reply(200)


class HoldingEndpoint:
    """Reads each request and never answers: counts the requests it holds open at once, and the
    most it held while ``busy()`` was true."""

    def __init__(self, busy: Any) -> None:
        self.busy = busy
        self.open = 0
        self.closed = 0  # requests the relay gave up on (its timeout)
        self.most_while_busy = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> HoldingEndpoint:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/never"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            return
        self.open += 1
        if self.busy():
            self.most_while_busy = max(self.most_while_busy, self.open)
        try:
            await reader.read()  # until the relay closes the connection
        except ConnectionError:
            pass
        finally:
            self.open -= 1
            self.closed += 1
            writer.close()


async def test_a_dead_endpoint_beside_a_healthy_one_holds_no_more_than_its_share(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    healthy = 200
    delivered: list[int] = []  # per healthy delivery: how many dead requests had ended by then
    dead = await HoldingEndpoint(lambda: len(delivered) < healthy).start()
    receiver.responder = lambda _: delivered.append(dead.closed) or Reply(200)
    try:
        await seed_many(db, 1000, event_type="Dead")  # before the healthy ones: leased first
        await seed_many(db, healthy, event_type="OrderCompleted")
        webhooks = {"Dead": {"url": dead.url()}, "OrderCompleted": {"url": receiver.url("/o")}}
        settings = make_settings(webhooks=webhooks, http_timeout_seconds=5, concurrency=16)
        async with open_relay(settings) as relay:
            run = asyncio.create_task(relay.processor.execute(budget_seconds=30))
            await eventually(lambda: len(delivered) == healthy or dead.closed > 0, timeout=30)
            relay.processor.stop()
            await run
    finally:
        await dead.stop()
    # Two endpoints with work: the dead one never held more than half of the 16 slots...
    assert settings.concurrency == 16
    assert 0 < dead.most_while_busy <= 8
    # ...and every healthy message was delivered while its first requests were still open.
    assert len(delivered) == healthy
    assert delivered[-1] == 0


async def cool_down_over_for_orders(db: Any) -> None:
    """OrderCompleted's breaker open and its cool-down just over: the next delivery probes it."""
    await db.execute(
        "INSERT INTO outbox_endpoints (event_type, endpoint, consecutive_failures, opens,"
        " opened_at, reopen_at) VALUES ('OrderCompleted', 'OrderCompleted', $1, 1,"
        " now() - interval '1 minute', now() - interval '1 second')",
        THRESHOLD,
    )


async def test_a_probe_that_is_not_sent_is_given_back(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Another run of the process holds its only request slot until `answer` is set.
    answer = asyncio.Event()
    receiver.script("/unsigned", Reply(200, hold=answer))
    await seed(db, 1, event_type="Unsigned")
    async with open_relay(make_settings(concurrency=1)) as relay:
        long_run = asyncio.create_task(relay.processor.execute(budget_seconds=30))
        await eventually(lambda: receiver.in_flight == 1)
        await cool_down_over_for_orders(db)
        [message_id] = await seed(db, 1)
        # A short run leases the message and claims the probe; its delivery waits for the slot
        # beyond the run's budget, so once it has one the probe is not sent.
        short_run = asyncio.create_task(relay.processor.execute(budget_seconds=0.2))
        await eventually(lambda: _probe_claimed(db))
        await asyncio.sleep(0.3)  # the short run's budget ends while its delivery waits
        answer.set()
        short = await short_run
        await long_run
        assert (short.processed, short.failed) == (0, 0)
        assert [r.path for r in receiver.requests] == ["/unsigned"]

        # The claim in the database lapses (a probe's timeout); the next run probes the
        # endpoint: the probe given back does not keep the endpoint's deliveries waiting.
        await db.execute("UPDATE outbox_endpoints SET probe_until = now()")
        await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
        later = await asyncio.wait_for(relay.processor.execute(budget_seconds=5), 30)
    assert later.processed == 1
    assert [r.path for r in receiver.requests] == ["/unsigned", "/orders"]
    status = await db.fetchval(
        "SELECT status FROM outbox_messages WHERE outbox_message_id = $1", message_id
    )
    assert status == "Processed"
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints") == 0  # closed by it


async def test_a_lease_that_returns_during_a_probe_claim_does_not_keep_the_claim_here(
    db: Any, database_url: str
) -> None:
    key = ("OrderCompleted", "OrderCompleted")
    await cool_down_over_for_orders(db)
    seen = [store.BreakerSeen(*key, failures=THRESHOLD, reopen_in=-1.0, probing=False)]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    other = await asyncpg.connect(database_url)
    try:
        breakers = BreakerWriter(store.PostgresStore(pool), lambda _: [])
        breakers.book.learn(seen, as_of=time.monotonic())
        assert breakers.book.verdict(key) == PROBE
        # Another relay is claiming the probe; this one's claim waits for its row lock.
        claiming = other.transaction()
        await claiming.start()
        await other.execute("UPDATE outbox_endpoints SET probe_until = now() + interval '30 s'")
        claim = asyncio.create_task(breakers.claim_probe(key, 5.0))
        await eventually(lambda: _waiting_for_a_lock(db))
        # A lease sent after the claim started returns meanwhile.
        breakers.book.learn(seen, as_of=time.monotonic())
        await claiming.commit()
        assert await claim is False  # the other relay probes
    finally:
        await other.close()
        await pool.close()
    assert not breakers.book.holds_back(key)  # nothing here waits for a probe of its own
    assert breakers.book.verdict(key) == 1.0  # they wait for the other relay's probe instead


async def _probe_claimed(db: Any) -> bool:
    return bool(
        await db.fetchval("SELECT count(*) FROM outbox_endpoints WHERE probe_until > now()")
    )


async def _waiting_for_a_lock(db: Any) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM pg_locks WHERE NOT granted"))


async def test_a_relay_told_to_stop_while_it_claims_a_probe_does_not_send_it(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any
) -> None:
    await cool_down_over_for_orders(db)
    [message_id] = await seed(db, 1)
    other = await asyncpg.connect(database_url)
    try:
        async with open_relay(make_settings()) as relay:
            # The endpoint's row is locked: the relay's claim of the probe waits.
            locking = other.transaction()
            await locking.start()
            await other.execute("SELECT * FROM outbox_endpoints FOR UPDATE")
            run = asyncio.create_task(relay.processor.execute(budget_seconds=10))
            await eventually(lambda: _waiting_for_a_lock(db))
            relay.processor.stop()
            await locking.rollback()  # the claim goes through after all
            summary = await run
    finally:
        await other.close()
    assert receiver.requests == []
    assert (summary.processed, summary.failed) == (0, 0)
    row = await db.fetchrow(
        "SELECT status, attempt_count FROM outbox_messages WHERE outbox_message_id = $1",
        message_id,
    )
    assert (row["status"], row["attempt_count"]) == ("Pending", 0)


async def test_a_pause_stops_what_a_run_already_leased_and_resume_sends_it(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any
) -> None:
    """Found: with 40 messages in one lease to an endpoint taking one request at a time, a pause
    reached none of them (it was read at the next lease only): all 40 went out during it."""
    release = asyncio.Event()
    receiver.script("/paused", Reply(hold=release), then=Reply())
    ids = await seed_many(db, 10, event_type="Slow")
    webhooks = {"Slow": {"url": receiver.url("/paused"), "max_concurrency": 1}}
    settings = make_settings(webhooks=webhooks, batch_size=10)
    operator = {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_WEBHOOKS": json.dumps(webhooks)}
    key = ("Slow", "Slow")
    async with open_relay(settings) as relay:
        run = asyncio.create_task(relay.processor.execute())
        await eventually(lambda: len(receiver.requests) == 1)  # the first, held; nine leased
        paused = await run_cli("pause", "Slow", env=operator)
        assert paused.returncode == 0, paused.stderr
        # The running run reads it (about once a second) though it leases nothing meanwhile.
        await eventually(lambda: relay.processor._breakers.book.paused(key))
        release.set()  # the request in flight finishes; no new one starts
        summary = await run
    assert len(receiver.requests) == 1
    assert (summary.leased, summary.processed) == (10, 1)
    rows = await db.fetch(
        "SELECT status, attempt_count, next_attempt_at > now() + interval '1 minute' AS later "
        "FROM outbox_messages WHERE outbox_message_id <> $1",
        uuid.UUID(receiver.requests[0].webhook_id),
    )
    # Back to Pending, no attempt spent, waiting for the endpoint's resume.
    assert {(r["status"], r["attempt_count"], r["later"]) for r in rows} == {("Pending", 0, True)}
    resumed = await run_cli("resume", "Slow", env=operator)
    assert resumed.returncode == 0, resumed.stderr
    async with open_relay(settings) as relay:
        await relay.processor.execute()
    assert await statuses(db) == {"Processed": 10}
    assert {r.webhook_id for r in receiver.requests} == {str(i) for i in ids}
