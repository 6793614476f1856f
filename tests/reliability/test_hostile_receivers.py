"""Receivers that misbehave on purpose: each gets its documented outcome, and nothing they send
makes ``last_error`` or the relay's memory grow with them."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from outbox.core.outcomes import MAX_ERROR_CHARS
from outbox.relay.breakers import THRESHOLD
from tests.conftest import SECRET
from tests.support.instrumented_relay import memory_growth_kib
from tests.support.outbox_helpers import eventually, open_relay, row, seed, statuses
from tests.support.raw_server import (
    Answer,
    RawServer,
    StrayServer,
    bytes_answer,
    endless_body_answer,
    trickle_answer,
)
from tests.support.receiver import Receiver, Reply
from tests.support.relay_process import relay_env, run_relay

TOKEN_PATH = "/hooks/capability-token-7f3a"  # a URL that is a credential must never be echoed
FIFTY_MB = 50 * 1024 * 1024


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Answer], Any]]:
    servers: list[RawServer] = []

    async def start(answer: Answer) -> RawServer:
        server = await RawServer(answer).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def webhooks_to(url: str) -> dict[str, Any]:
    return {"OrderCompleted": {"url": url, "secret": SECRET}}


async def assert_retried_with_a_bounded_error(db: Any, message_id: Any, starts_with: str) -> None:
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Pending", 1)
    assert stored["last_error"].startswith(starts_with), stored["last_error"]
    assert len(stored["last_error"]) <= MAX_ERROR_CHARS
    assert "capability-token" not in stored["last_error"]
    assert 8.5 <= stored["due_in"] <= 10.0  # the first backoff step


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (bytes_answer(b"garbage instead of a status line\r\n\r\n"), "ClientResponseError: 400"),
        (
            bytes_answer(b"HTTP/1.1 200 OK\r\nx-flood: " + b"a" * 100_000 + b"\r\n\r\n"),
            "ClientResponseError: 400",
        ),
        (
            bytes_answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"),
            "ClientResponseError: 400",
        ),
        (bytes_answer(b""), "ServerDisconnectedError"),
    ],
    ids=["bad-status-line", "100kB-header", "broken-chunked-body", "closed-without-answer"],
)
async def test_invalid_http_is_a_transport_error_retried_with_backoff(
    db: Any, make_settings: Any, raw_server: Any, answer: Answer, error: str
) -> None:
    server = await raw_server(answer)
    [message_id] = await seed(db)
    settings = make_settings(webhooks=webhooks_to(server.url(TOKEN_PATH)))
    async with open_relay(settings) as relay:
        summary = await relay.processor.execute()
    assert server.requests == 1
    assert summary.retried == 1
    await assert_retried_with_a_bounded_error(db, message_id, error)


async def test_a_url_the_client_rewrites_is_still_kept_out_of_last_error(
    db: Any, make_settings: Any, raw_server: Any
) -> None:
    # aiohttp reports a malformed answer with the URL as yarl normalised it ("%2F" becomes "/"),
    # which is not the configured text: the capability in it must not leak either way.
    server = await raw_server(bytes_answer(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"))
    url = server.url(TOKEN_PATH) + "?token=c2VjcmV0LXRva2Vu&next=%2Fdone"
    [message_id] = await seed(db)
    async with open_relay(make_settings(webhooks=webhooks_to(url))) as relay:
        summary = await relay.processor.execute()
    assert summary.retried == 1
    await assert_retried_with_a_bounded_error(db, message_id, "ClientResponseError: 400")
    stored = await row(db, message_id)
    assert "c2VjcmV0LXRva2Vu" not in stored["last_error"]
    assert "/done" not in stored["last_error"]


async def test_slow_loris_headers_time_out_and_are_retried(
    db: Any, make_settings: Any, raw_server: Any
) -> None:
    # The status line at once, then one header byte every 50 ms, for ever.
    server = await raw_server(trickle_answer(b"HTTP/1.1 200 OK\r\nx-slow: ", b"a", 0.05))
    [message_id] = await seed(db)
    settings = make_settings(webhooks=webhooks_to(server.url(TOKEN_PATH)), http_timeout_seconds=1)
    async with open_relay(settings) as relay:
        summary = await relay.processor.execute()
    assert summary.retried == 1
    await assert_retried_with_a_bounded_error(db, message_id, "timed out after 1s")
    assert server.bytes_sent > len(b"HTTP/1.1 200 OK\r\nx-slow: ")  # it really was trickling


@pytest.mark.parametrize(("status", "outcome"), [(200, "Processed"), (500, "Pending")])
async def test_a_50_mb_response_body_is_not_read(
    db: Any, database_url: str, raw_server: Any, status: int, outcome: str
) -> None:
    server = await raw_server(endless_body_answer(status, FIFTY_MB))
    [message_id] = await seed(db)
    env = relay_env(database_url, webhooks_to(server.url(TOKEN_PATH)))
    result = await run_relay(env, "--", "drain", module="tests.support.instrumented_relay")
    assert result.returncode == 0, result.stderr
    stored = await row(db, message_id)
    assert stored["status"] == outcome
    if status == 500:
        assert stored["last_error"].startswith("HTTP 500: xxxx")
        assert len(stored["last_error"]) <= MAX_ERROR_CHARS
    # The relay read a snippet and hung up: the server could not push the body through the
    # socket buffers, and the relay's memory grew by about 1 MB over the run (a relay that
    # reads the body grows by about 100 MB).
    assert server.requests == 1
    assert server.bytes_sent < FIFTY_MB // 4
    assert memory_growth_kib(result.stderr) * 1024 < FIFTY_MB // 5


async def test_a_5xx_storm_backs_off_and_every_message_is_delivered_after_recovery(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 20)
    # 12 failures: the first ten open the endpoint's breaker, two probes fail, then the receiver
    # has recovered. One request at a time, so that the breaker opens at exactly the tenth.
    receiver.script("/orders", *[Reply(503, b"storm " * 200)] * 12)
    async with open_relay(make_settings(batch_size=20, concurrency=1)) as relay:
        first = await relay.processor.execute()
        assert (first.retried, first.processed, first.failed) == (THRESHOLD, 0, 0)
        assert await db.fetchval(
            "SELECT bool_and(next_attempt_at - now() BETWEEN interval '8.5 s' AND interval '10 s')"
            " FROM outbox_messages"
        )  # the retried ones by their backoff, the held ones by the breaker's cool-down
        held = await db.fetchval("SELECT count(*) FROM outbox_messages WHERE attempt_count = 0")
        assert held == 20 - THRESHOLD  # the breaker's wait spends no attempt
        summaries = [first]
        while await statuses(db) != {"Processed": 20}:
            assert len(summaries) < 6, summaries
            await _let_the_backoff_pass(db)
            summaries.append(await relay.processor.execute())
    assert [s.processed for s in summaries] == [0, 0, 0, 20]  # two probes fail, the third passes
    hits = Counter(r.webhook_id for r in receiver.requests)
    for stored in await db.fetch("SELECT * FROM outbox_messages"):
        assert stored["attempt_count"] == hits[str(stored["outbox_message_id"])]
        assert stored["last_error"] is None
    assert sum(hits.values()) == 12 + 20
    assert set(hits) == {str(i) for i in ids}


async def _let_the_backoff_pass(db: Any) -> None:
    """Move due times of waiting rows and the breaker's reopen time to now, as if the backoff
    and the cool-down had elapsed (both are asserted above and in other tests; waiting 10-40 s
    would add nothing)."""
    await db.execute("UPDATE outbox_endpoints SET reopen_at = now() WHERE reopen_at IS NOT NULL")
    await db.execute("UPDATE outbox_messages SET next_attempt_at = now() WHERE status = 'Pending'")


@pytest.mark.parametrize("status", [301, 307, 308])
async def test_redirects_of_every_kind_are_not_followed(
    db: Any, receiver: Receiver, make_settings: Any, status: int
) -> None:
    receiver.script("/orders", Reply(status, headers={"Location": receiver.url("/elsewhere")}))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.retried == 1  # retried: the endpoint's URL may be updated meanwhile
    assert receiver.to("/elsewhere") == []
    stored = await row(db, message_id)
    assert stored["status"] == "Pending"
    assert stored["last_error"].startswith(f"HTTP {status}")
    assert "redirects are not followed" in stored["last_error"]


@pytest.mark.parametrize("status", [500, 410])
async def test_nul_bytes_in_an_error_body_are_recorded_not_fatal(
    db: Any, receiver: Receiver, make_settings: Any, status: int
) -> None:
    # PostgreSQL text cannot hold U+0000: written as sent, the body would fail the whole batch's
    # outcome write, and the batch would be delivered again and again after each lease.
    receiver.script("/orders", Reply(status, b"bad\x00thing\x00"))
    ids = await seed(db, 3)
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.error is None
    assert (summary.retried + summary.failed, summary.processed) == (1, 2)
    stored = [await row(db, message_id) for message_id in ids]
    [failed] = [s for s in stored if s["status"] != "Processed"]
    assert failed["status"] == ("Pending" if status == 500 else "Failed")
    assert failed["last_error"] == f"HTTP {status}: bad\ufffdthing\ufffd"
    snippet = await db.fetchval(
        "SELECT response_snippet FROM outbox_attempts WHERE outbox_message_id = $1",
        failed["outbox_message_id"],
    )
    assert snippet == "bad\ufffdthing\ufffd"


async def test_a_retry_after_of_non_ascii_digits_is_ignored_not_fatal(
    db: Any, make_settings: Any, raw_server: Any
) -> None:
    # "²" passes str.isdigit() but not float(): it used to raise while the batch's outcomes were
    # decided, and the whole batch stayed Processing until its lease ran out, every time.
    answer = (
        b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: \xc2\xb2\r\nContent-Length: 0\r\n\r\n"
    )
    server = await raw_server(bytes_answer(answer))
    ids = await seed(db, 3)
    async with open_relay(make_settings(webhooks=webhooks_to(server.url(TOKEN_PATH)))) as relay:
        summary = await relay.processor.execute()
    assert (summary.retried, summary.unrecorded, summary.error) == (3, 0, None)
    for message_id in ids:
        await assert_retried_with_a_bounded_error(db, message_id, "HTTP 503")


async def test_a_url_echoed_across_the_snippet_limit_is_not_cut_in_half(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # Redacting after cutting would leave the first half of a token that straddles the cut.
    url = receiver.url("/orders/CUTt0kenSecretLongValue")
    # 512 bytes end eight characters into the token.
    padding = 512 - len(" url=") - url.index("CUT") - 8
    receiver.script(
        "/orders/CUTt0kenSecretLongValue", Reply(500, b"x" * padding + f" url={url}".encode())
    )
    [message_id] = await seed(db)
    settings = make_settings(webhooks=webhooks_to(url))
    async with open_relay(settings) as relay:
        await relay.processor.execute()
    snippet = await db.fetchval(
        "SELECT response_snippet FROM outbox_attempts WHERE outbox_message_id = $1", message_id
    )
    stored = await row(db, message_id)
    for text in (snippet, stored["last_error"]):
        assert "CUTt0ken" not in text
        assert "/orders/" not in text


@pytest.fixture
async def stray_server() -> AsyncIterator[Callable[..., Any]]:
    servers: list[StrayServer] = []

    async def start(answers: dict[str, list[int]], stray: dict[str, float]) -> StrayServer:
        server = await StrayServer(answers, stray).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


async def assert_answered_503(db: Any, message_id: Any) -> None:
    stored = await row(db, message_id)
    assert (stored["status"], stored["last_error"]) == ("Pending", "HTTP 503"), dict(stored)
    history = await db.fetch(
        "SELECT http_status FROM outbox_attempts WHERE outbox_message_id = $1", message_id
    )
    assert [r["http_status"] for r in history] == [503]


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.3], ids=["with-the-answer", "20ms", "300ms"])
async def test_a_stray_response_is_never_taken_for_a_later_request_s_answer(
    db: Any, make_settings: Any, stray_server: Any, delay: float
) -> None:
    # /stray answers 200 and then, unasked, another 200; its second request gets a 503.
    # /broken, on the same host and port, only ever answers 503.
    server = await stray_server({"/stray": [200, 503], "/broken": [503]}, {"/stray": delay})
    webhooks = {"Stray": {"url": server.url("/stray")}, "Broken": {"url": server.url("/broken")}}
    async with open_relay(make_settings(webhooks=webhooks, concurrency=1)) as relay:
        await seed(db, event_type="Stray")
        assert (await relay.processor.execute()).processed == 1

        async def stray_arrived() -> bool:
            return server.strays_sent == 1

        await eventually(stray_arrived)  # it arrived before the next request was sent
        [again] = await seed(db, event_type="Stray")
        [other] = await seed(db, event_type="Broken")
        summary = await relay.processor.execute()
    assert (summary.processed, summary.retried) == (0, 2)
    await assert_answered_503(db, again)
    await assert_answered_503(db, other)


async def test_stray_responses_under_load_never_mark_another_endpoint_s_message_delivered(
    db: Any, make_settings: Any, stray_server: Any
) -> None:
    server = await stray_server({"/stray": [200], "/broken": [503]}, {"/stray": 0.002})
    webhooks = {"Stray": {"url": server.url("/stray")}, "Broken": {"url": server.url("/broken")}}
    broken = []
    for _ in range(50):
        await seed(db, 3, event_type="Stray")
        broken += await seed(db, event_type="Broken")
    async with open_relay(make_settings(webhooks=webhooks)) as relay:
        summary = await relay.processor.execute(budget_seconds=30)
    assert summary.processed == 150
    sent = server.requests.count("/broken")
    assert THRESHOLD <= sent < 50  # then its breaker held the rest back
    answered = 0
    for message_id in broken:
        stored = await row(db, message_id)
        if stored["attempt_count"]:
            await assert_answered_503(db, message_id)
            answered += 1
        else:  # held by the breaker: never sent, nothing recorded
            assert (stored["status"], stored["last_error"]) == ("Pending", None)
    assert answered == sent


async def test_terminal_escapes_and_forged_lines_are_stored_and_logged_escaped(
    db: Any, receiver: Receiver, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # A body that would clear the operator's screen, retitle the terminal and ring its bell.
    receiver.script("/orders", Reply(500, b"\x1b[2J\x1b]0;pwned\x07Internal error\x1b[31m"))
    [message_id] = await seed(db)
    # An event type written by hand (enqueue refuses it) that would forge a log line.
    forged = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "VALUES (gen_random_uuid(), $1, '{}') RETURNING outbox_message_id",
        "Evil\nERROR outbox.drain: FORGED LINE",
    )
    with caplog.at_level(logging.DEBUG):
        async with open_relay(make_settings()) as relay:
            summary = await relay.processor.execute()
    assert (summary.retried, summary.failed) == (1, 1)
    stored = await row(db, message_id)
    assert stored["last_error"] == "HTTP 500: \\x1b[2J\\x1b]0;pwned\\x07Internal error\\x1b[31m"
    [snippet] = await db.fetch(
        "SELECT response_snippet FROM outbox_attempts WHERE outbox_message_id = $1", message_id
    )
    assert snippet["response_snippet"].isprintable()
    assert (await row(db, forged))["last_error"].isprintable()
    lines = [record.getMessage() for record in caplog.records]
    assert any("\\x1b[2J" in line for line in lines)
    assert any("Evil\\x0aERROR outbox.drain: FORGED LINE" in line for line in lines)
    for line in lines:
        assert line.isprintable(), line
