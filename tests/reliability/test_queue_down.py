"""The wake-up queue is down when a producer commits: the commit stands, ``notify`` only warns, and
the timer's sweep delivers the message."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from azure.functions.timer import TimerRequest

import outbox
from outbox.azure import functions
from outbox.azure.host import functions_host
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import WakeUpQueue
from tests.support.azure import DEV_KEY
from tests.support.azurite import Azurite
from tests.support.outbox_helpers import row
from tests.support.raw_server import RawServer
from tests.support.receiver import Receiver


@pytest.fixture
async def timer_env(
    monkeypatch: pytest.MonkeyPatch, database_url: str, webhooks: dict[str, Any]
) -> AsyncIterator[None]:
    """App settings for the Functions app's timer, and a fresh per-process relay afterwards."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_WEBHOOKS", json.dumps(webhooks))
    yield
    await functions_host.close()


@pytest.fixture
async def orders(db: Any) -> Any:
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    return db


async def commit_an_order(db: Any, queue: WakeUpQueue) -> Any:
    async with outbox.transaction(db, queue) as tx:
        await db.execute("INSERT INTO orders VALUES (7)")
        return await tx.enqueue("OrderCompleted", {"orderId": 7})


async def assert_committed_and_swept(db: Any, receiver: Receiver, message_id: Any) -> None:
    assert await db.fetchval("SELECT count(*) FROM orders") == 1
    assert (await row(db, message_id))["status"] == "Pending"
    await functions.outbox_timer(TimerRequest())
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    assert (await row(db, message_id))["status"] == "Processed"


async def test_azurite_stopped_at_notify_commits_warns_and_the_timer_delivers(
    orders: Any, receiver: Receiver, timer_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    azurite = Azurite().start()
    try:
        settings = QueueSettings.load(queue_connection=azurite.connection_string)
        async with WakeUpQueue.from_settings(settings) as queue:
            assert await queue.notify() is True  # the queue was there a moment ago
            azurite.stop()
            with caplog.at_level(logging.WARNING):
                message_id = await commit_an_order(orders, queue)
    finally:
        azurite.stop()
    [warning] = [r for r in caplog.records if "wake-up hint not sent" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert DEV_KEY not in caplog.text
    await assert_committed_and_swept(orders, receiver, message_id)


@pytest.mark.slow
async def test_a_queue_that_never_answers_delays_the_producer_only_by_the_hint_timeout(
    orders: Any, receiver: Receiver, timer_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    async def never_answer(writer: Any, server: RawServer) -> None:
        await asyncio.Event().wait()

    hung = await RawServer(never_answer).start()
    try:
        connection = (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={DEV_KEY};QueueEndpoint=http://127.0.0.1:{hung.port}/devstoreaccount1;"
        )
        settings = QueueSettings.load(queue_connection=connection)
        async with WakeUpQueue.from_settings(settings) as queue:
            with caplog.at_level(logging.WARNING):
                message_id = await commit_an_order(orders, queue)
    finally:
        await hung.stop()
    assert hung.requests >= 1  # the hint was sent and left hanging
    assert "wake-up hint not sent" in caplog.text
    assert DEV_KEY not in caplog.text
    await assert_committed_and_swept(orders, receiver, message_id)
