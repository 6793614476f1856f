"""The example receivers, end to end: the relay delivers one event twice, the shipment is made once.

The crash window is simulated where it opens: the receiver has committed, the relay's outcome is
lost, so the row is due again (set back to Pending by hand) and the next drain delivers the same
webhook id once more, newly signed. The Functions example runs behind ``outbox serve``'s HTTP host,
which hands it real ``azure.functions.HttpRequest`` objects (the Functions host itself cannot run
here); a few requests are also made by hand.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import azure.functions as func
import pytest
from aiohttp import web

from examples import aiohttp_receiver, functions_receiver
from outbox.core.settings import Settings, decode_secret
from outbox.core.signing import sign
from outbox.hosting import serve
from outbox.store.migrate import migrate_inbox
from tests.conftest import SECRET
from tests.support import pg
from tests.support.azure import free_port
from tests.support.outbox_helpers import open_relay, seed

ROOT = Path(__file__).resolve().parents[2]
OTHER_SECRET = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"


@pytest.fixture
async def consumer_url(admin_dsn: str) -> AsyncIterator[str]:
    """The receiving service's own database: the inbox and the examples' shipments table."""
    name = pg.unique_name("outbox_receiver")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    url = pg.with_database(admin_dsn, name)
    conn = await asyncpg.connect(url)
    try:
        await migrate_inbox(conn)
        await conn.execute((ROOT / "examples" / "shipments.sql").read_text())
    finally:
        await conn.close()
    yield url
    await pg.drop(admin_dsn, name)


@pytest.fixture
async def consumer(consumer_url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(consumer_url)
    yield conn
    await conn.close()


@asynccontextmanager
async def functions_example(url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """The Functions example's orders webhook, served as ``outbox serve --app`` serves it."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", url)
    monkeypatch.setenv("ORDERS_WEBHOOK_SECRET", f"{OTHER_SECRET} {SECRET}")  # mid-rotation
    bindings = serve.index(serve.load_app("examples.functions_receiver:bp"))
    port = free_port()
    runner = await serve.start_http(bindings, serve.ServeOptions(port=port))
    try:
        yield f"http://127.0.0.1:{port}/api/webhooks/orders"
    finally:
        await runner.cleanup()
        await functions_receiver.close_pools()


@asynccontextmanager
async def aiohttp_example(url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    runner = web.AppRunner(aiohttp_receiver.make_app(url, SECRET))
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}/webhooks/orders"
    finally:
        await runner.cleanup()


EXAMPLES = {"functions": functions_example, "aiohttp": aiohttp_example}


@pytest.fixture(params=sorted(EXAMPLES))
async def example_url(
    request: pytest.FixtureRequest, consumer_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    """Where one example receiver listens, running against the consumer's database."""
    async with EXAMPLES[request.param](consumer_url, monkeypatch) as url:
        yield url


async def deliver_twice(db: Any, settings: Settings) -> uuid.UUID:
    """Commit one OrderCompleted event; the relay delivers it, loses its outcome, delivers again."""
    [message_id] = await seed(db, 1, payload=lambda i: {"orderId": 42})
    async with open_relay(settings) as relay:
        assert (await relay.drain()).processed == 1
        await db.execute(
            "UPDATE outbox_messages SET status = 'Pending', next_attempt_at = now(), "
            "processed_at = NULL WHERE outbox_message_id = $1",
            message_id,
        )
        assert (await relay.drain()).processed == 1
    return message_id


async def assert_shipped_once(db: Any, consumer: Any, message_id: uuid.UUID) -> None:
    answers = await db.fetch(
        "SELECT http_status FROM outbox_attempts WHERE outbox_message_id = $1", message_id
    )
    assert [a["http_status"] for a in answers] == [204, 204]  # the duplicate is 2xx too
    shipments = await consumer.fetch("SELECT order_id, webhook_id FROM shipments")
    assert [tuple(s) for s in shipments] == [(42, str(message_id))]
    assert await consumer.fetchval("SELECT array_agg(webhook_id) FROM outbox_inbox") == [
        str(message_id)
    ]


async def test_an_event_delivered_twice_is_shipped_once(
    example_url: str, db: Any, consumer: Any, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(webhooks={"OrderCompleted": {"url": example_url, "secret": SECRET}})
    message_id = await deliver_twice(db, settings)
    await assert_shipped_once(db, consumer, message_id)


async def test_a_request_signed_with_another_secret_is_refused_and_changes_nothing(
    example_url: str, consumer: Any
) -> None:
    body = b'{"id": "msg_1", "type": "OrderCompleted", "timestamp": "2026-01-02T03:04:05Z", '
    body += b'"data": {"orderId": 1}}'
    wrong = "whsec_" + "V1JPTkctU0VDUkVULUZPUi1URVNUUw=="
    headers = signed_headers("msg_1", body, wrong)
    async with (
        aiohttp.ClientSession() as http,
        http.post(example_url, data=body, headers=headers) as got,
    ):
        assert got.status == 401
        assert "no signature" in await got.text()
    assert await consumer.fetchval("SELECT count(*) FROM shipments") == 0
    assert await consumer.fetchval("SELECT count(*) FROM outbox_inbox") == 0


def signed_headers(message_id: str, body: bytes, secret: str) -> dict[str, str]:
    timestamp = int(time.time())
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign([decode_secret(secret)], message_id, timestamp, body),
        "content-type": "application/json",
    }


async def test_the_functions_receiver_answers_requests_made_by_hand(
    consumer: Any, consumer_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", consumer_url)
    monkeypatch.setenv("ORDERS_WEBHOOK_SECRET", SECRET)
    body = (
        b'{"type": "OrderCompleted", "timestamp": "2026-01-02T03:04:05Z", "data": {"orderId": 7}}'
    )

    def request(headers: dict[str, str]) -> func.HttpRequest:
        url = "http://localhost/api/webhooks/orders"
        return func.HttpRequest("POST", url, headers=headers, body=body)

    good = {k.title(): v for k, v in signed_headers("msg_7", body, SECRET).items()}
    tampered = good | {"Webhook-Id": "msg_8"}
    try:
        answers = [
            (await functions_receiver.orders_webhook(request(h))).status_code
            for h in (good, good, tampered)
        ]
    finally:
        await functions_receiver.close_pools()
    assert answers == [204, 204, 401]
    shipments = await consumer.fetch("SELECT order_id, webhook_id FROM shipments")
    assert [tuple(s) for s in shipments] == [(7, "msg_7")]


def test_a_services_own_tests_use_outbox_testing_as_documented(admin_dsn: str) -> None:
    """examples/orders_service: a service's tests with outbox.testing and the opt-in fixtures,
    run as that project runs them (pytest in its folder, its own settings)."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT / "examples" / "orders_service",
        env={**os.environ, "OUTBOX_TEST_ADMIN_DSN": admin_dsn},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout
