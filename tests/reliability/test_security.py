"""Secrets stay out of everything the relay writes, and https endpoints are verified by default.

Every failure that could carry a secret is provoked at once (a receiver that reflects the URL it
was called on, a refused connection, invalid HTTP, the database lost, the queue unreachable) and
everything the relay produced is searched for each secret: logs at DEBUG from every logger,
``last_error``, summaries, the drain endpoint's answers, and a relay process's output.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest

import outbox
from outbox import operations
from outbox.azure import functions
from outbox.azure.host import functions_host
from outbox.core.errors import OutboxError
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import open_relay, seed
from tests.support.raw_server import RawServer, bytes_answer
from tests.support.receiver import Received, Receiver, Reply
from tests.support.relay_process import relay_env, run_relay
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls import self_signed_certificate, server_context

DB_PASSWORD = "db-pw-4c1d"
ACCOUNT_KEY = "c3RvcmFnZS1rZXktdGhhdC1tdXN0LW5vdC1sZWFr"  # base64 "storage-key-that-must-not-leak"
ECHO_PATH = "/echo/capability-token-abc"
ECHO_QUERY = "token=querytoken123"
REFUSED_PATH = "/hooks/capability-token-def"
BROKEN_PATH = "/hooks/capability-token-ghi"
SECRETS = [
    SECRET,
    SECRET.removeprefix("whsec_"),
    DB_PASSWORD,
    ACCOUNT_KEY,
    "capability-token-abc",
    "querytoken123",
    "capability-token-def",
    "capability-token-ghi",
]


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} leaked into {where}"


@pytest.fixture
async def broken_receiver() -> AsyncIterator[RawServer]:
    server = await RawServer(bytes_answer(b"not http at all\r\n\r\n")).start()
    yield server
    await server.stop()


@pytest.fixture
def hostile_env(
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    receiver: Receiver,
    proxy: TcpProxy,
    broken_receiver: RawServer,
) -> dict[str, str]:
    """App settings full of secrets, pointing at receivers that fail in every way."""
    echo_url = receiver.url(f"{ECHO_PATH}?{ECHO_QUERY}")
    # The receiver reflects the URL it was called on, as many error pages do.
    receiver.script(ECHO_PATH, then=Reply(500, f"no route for {echo_url}".encode()))
    parts = urlsplit(database_url)
    env = {
        "OUTBOX_DATABASE_URL": urlunsplit(
            parts._replace(netloc=f"postgres:{DB_PASSWORD}@127.0.0.1:{proxy.port}")
        ),
        "OUTBOX_WEBHOOKS": json.dumps(
            {
                "Echo": {"url": echo_url, "secret": SECRET},
                "Refused": {"url": f"http://127.0.0.1:{free_port()}{REFUSED_PATH}"},
                "Broken": {"url": broken_receiver.url(BROKEN_PATH), "secret": SECRET},
            }
        ),
        "AzureWebJobsStorage": (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={ACCOUNT_KEY};QueueEndpoint=http://127.0.0.1:{free_port()}/devstoreaccount1;"
        ),
        "OUTBOX_HTTP_TIMEOUT_SECONDS": "5",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


async def seed_every_failure(db: Any) -> None:
    for event_type in ("Echo", "Refused", "Broken"):
        await seed(db, 2, event_type=event_type)


def drain_request() -> func.HttpRequest:
    return func.HttpRequest(method="POST", url="/api/outbox/drain", headers={}, params={}, body=b"")


async def test_secrets_never_reach_logs_last_error_summaries_or_drain_answers(
    db: Any, proxy: TcpProxy, hostile_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level: aiohttp, asyncpg, azure too
    await seed_every_failure(db)
    try:
        answered = await functions.outbox_drain(drain_request())
        assert answered.status_code == 200
        summary = json.loads(answered.get_body())
        assert (summary["leased"], summary["retried"]) == (6, 6)

        hint_sent = await outbox.notify()  # the queue endpoint refuses the connection
        assert hint_sent is False

        proxy.down()
        await seed_every_failure(db)  # written directly: the relay can no longer reach them
        lost = await functions.outbox_drain(drain_request())
        assert lost.status_code == 503
        with pytest.raises(OutboxError) as timer_failure:
            await functions.outbox_timer(TimerRequest())
    finally:
        proxy.up()
        await functions_host.close()

    errors = [r["last_error"] for r in await db.fetch("SELECT last_error FROM outbox_messages")]
    assert sum(e is not None for e in errors) == 6
    for where, text in [
        ("last_error", "\n".join(e for e in errors if e)),
        ("the drain answer", answered.get_body().decode()),
        ("the drain answer with the database down", lost.get_body().decode()),
        ("the timer's failure", str(timer_failure.value)),
        ("the logs", caplog.text),
        ("the log records' arguments", "\n".join(repr(r.args) for r in caplog.records)),
    ]:
        assert_no_secret(where, text)
    assert "database error" in str(timer_failure.value)
    assert "wake-up hint not sent" in caplog.text


async def test_secrets_never_reach_a_relay_process_output(
    db: Any, hostile_env: dict[str, str], proxy: TcpProxy
) -> None:
    await seed_every_failure(db)
    env = relay_env("", {}) | hostile_env
    delivered = await run_relay(env)
    proxy.down()
    cut_off = await run_relay(env)
    proxy.up()

    assert delivered.returncode == 0, delivered.stderr
    assert delivered.summary["retried"] == 6
    assert cut_off.returncode == 1
    assert cut_off.summary["error"].startswith("database error")
    for name, result in [("drain", delivered), ("drain without a database", cut_off)]:
        assert_no_secret(f"{name} stdout", result.stdout)
        assert_no_secret(f"{name} stderr", result.stderr)


async def test_https_endpoints_are_verified_by_default(
    db: Any, database_url: str, make_settings: Any, tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    receiver = await Receiver(ssl_context=server_context(cert, key)).start()
    try:
        webhooks = {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        [message_id] = await seed(db)
        async with open_relay(make_settings(webhooks=webhooks)) as relay:
            refused = await relay.processor.execute()
        assert refused.retried == 1
        assert receiver.requests == []
        last_error = await db.fetchval("SELECT last_error FROM outbox_messages")
        assert last_error.startswith("ClientConnectorCertificateError")
        assert "certificate verify failed" in last_error

        # The same relay, told to trust that certificate, delivers: only verification stood
        # in the way.
        await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
        trusting = relay_env(database_url, webhooks) | {"SSL_CERT_FILE": str(cert)}
        trusted = await run_relay(trusting)
    finally:
        await receiver.stop()
    assert trusted.returncode == 0, trusted.stderr
    assert trusted.summary["processed"] == 1
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]


async def test_credentials_in_a_webhook_url_stay_out_in_every_form_the_relay_sends_them(
    db: Any, receiver: Receiver, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    user, password = "partner", "s3cret:pass word"
    url = f"http://{user}:{quote(password, safe='')}@127.0.0.1:{receiver.port}/echo-headers"
    # A receiver that echoes the request's headers in its error page, as debugging ones do.
    receiver.responder = lambda request: Reply(500, json.dumps(request.headers).encode())
    caplog.set_level(logging.DEBUG)
    [message_id] = await seed(db, event_type="Partner")
    settings = make_settings(webhooks={"Partner": {"url": url}})
    async with open_relay(settings) as relay:
        assert (await relay.processor.execute()).retried == 1
    basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    [request] = receiver.requests
    assert request.headers["authorization"] == f"Basic {basic}"  # what aiohttp made of the URL
    shown = json.dumps(await operations.show(db, message_id), default=str)
    assert "[redacted]" in shown
    for where, text in [("show", shown), ("the logs", caplog.text)]:
        for secret in (basic, password, quote(password, safe="")):
            assert secret not in text, f"{secret!r} leaked into {where}"


async def test_secrets_a_receiver_echoes_back_encoded_are_redacted_before_stored_or_logged(
    db: Any, receiver: Receiver, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    user, key = "tok3n-abc", "KEY/S3CRET+C/xyz=="  # a URL's user name alone, a header's value
    basic = base64.b64encode(f"{user}:".encode()).decode()

    def php_error_page(request: Received) -> Reply:
        # A PHP receiver dumping what it was sent: json_encode escapes "/" as "\/" by default,
        # and PHP_AUTH_USER is the Basic credential decoded.
        authorization = request.headers.get("authorization", "")
        decoded = base64.b64decode(authorization.removeprefix("Basic ")).decode()
        echoed = {
            "authorization": authorization,
            "php_auth_user": decoded.partition(":")[0],
            "x_key": request.headers.get("x-key", ""),
        }
        return Reply(500, json.dumps(echoed).replace("/", "\\/").encode())

    receiver.responder = php_error_page
    url = f"http://{user}@127.0.0.1:{receiver.port}/partner"
    settings = make_settings(webhooks={"Partner": {"url": url, "headers": {"X-Key": key}}})
    caplog.set_level(logging.DEBUG)
    [message_id] = await seed(db, event_type="Partner")
    async with open_relay(settings) as relay:
        assert (await relay.processor.execute()).retried == 1

    [request] = receiver.requests
    assert request.headers["authorization"] == f"Basic {basic}"  # what aiohttp made of the URL
    assert request.headers["x-key"] == key
    last_error = await db.fetchval("SELECT last_error FROM outbox_messages")
    [attempt] = await db.fetch(
        "SELECT error, response_snippet FROM outbox_attempts WHERE outbox_message_id = $1",
        message_id,
    )
    assert attempt["response_snippet"].count("[redacted]") == 3  # the body was kept, redacted
    assert last_error.startswith("HTTP 500: ")
    assert "outbox.delivery" in caplog.text  # the delivery's log line was written
    forms = [user, basic, basic.rstrip("="), key, key.replace("/", "\\/"), "S3CRET", "tok3n"]
    for where, text in [
        ("last_error", last_error),
        ("the attempt's error", attempt["error"]),
        ("the attempt's response_snippet", attempt["response_snippet"]),
        ("the logs", caplog.text),
        ("the log records' arguments", "\n".join(repr(r.args) for r in caplog.records)),
    ]:
        for form in forms:
            assert form not in text, f"{form!r} leaked into {where}"
