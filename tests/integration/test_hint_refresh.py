"""A producer's hint still waiting in the queue is refreshed in place rather than repeated (real
Azurite): the queue holds about one hint per producer process, however many transactions it
commits, and still every caller's hint is one no relay had taken when the caller asked."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.storage.queue import QueueSasPermissions, generate_queue_sas
from azure.storage.queue.aio import QueueClient

import outbox.sync
from outbox.core.settings import QueueSettings
from outbox.transport import covered
from outbox.transport.wakeup import WakeUpQueue, make_queue_client
from tests.integration.test_covered_hints import next_second
from tests.support.azure import DEV_ACCOUNT, DEV_KEY
from tests.support.azurite import Azurite
from tests.support.outbox_helpers import queued_hints


class Producer:
    """One producer process's hint client, async or sync (the sync one called off the loop)."""

    def __init__(self, kind: str, settings: QueueSettings) -> None:
        self.kind = kind
        self.queue: Any = (
            outbox.sync.WakeUpQueue.from_settings(settings)
            if kind == "sync"
            else WakeUpQueue.from_settings(settings)
        )

    async def notify(self) -> bool:
        if self.kind == "sync":
            return await asyncio.to_thread(outbox.sync.notify, self.queue)
        return bool(await self.queue.notify())

    async def close(self) -> None:
        closing = self.queue.close()
        if asyncio.iscoroutine(closing):
            await closing


@pytest.fixture(params=["async", "sync"])
async def producer(
    request: pytest.FixtureRequest, queue_settings: QueueSettings
) -> AsyncIterator[Producer]:
    made = Producer(request.param, queue_settings)
    yield made
    await made.close()


@pytest.fixture
async def raw(queue_settings: QueueSettings) -> AsyncIterator[QueueClient]:
    """The queue as a relay reads it (text as stored)."""
    async with make_queue_client(queue_settings, encoded=False) as client:
        yield client


def requested_at(content: str) -> float:
    return datetime.fromisoformat(json.loads(base64.b64decode(content))["requestedAt"]).timestamp()


async def test_hints_while_the_last_one_waits_refresh_it(
    producer: Producer, raw: QueueClient, queue_settings: QueueSettings
) -> None:
    assert await producer.notify()  # creates the queue, sends the hint
    [first] = await raw.peek_messages(max_messages=32)
    for _ in range(5):
        asked = time.time()
        assert await producer.notify()
    assert await queued_hints(queue_settings) == 1
    [hint] = await raw.peek_messages(max_messages=32)
    assert hint.id == first.id
    assert hint.dequeue_count == 0
    # Its content says when it was last asked for: after the last caller asked.
    assert requested_at(hint.content) >= asked - 1.0
    assert requested_at(hint.content) > requested_at(first.content)


async def test_a_hint_a_relay_has_taken_is_not_refreshed_a_new_one_is_sent(
    producer: Producer, raw: QueueClient, queue_settings: QueueSettings
) -> None:
    assert await producer.notify()
    # A relay receives it: the run it wakes may have begun before the next caller's commit.
    [taken] = [m async for m in raw.receive_messages(max_messages=1, visibility_timeout=30)]
    assert await producer.notify()
    [sent] = await raw.peek_messages(max_messages=32)  # the taken one is hidden
    assert sent.id != taken.id
    assert await queued_hints(queue_settings) == 2
    # Deleted once its run ended: the next caller's hint refreshes the new one.
    await raw.delete_message(taken)
    assert await producer.notify()
    assert [m.id for m in await raw.peek_messages(max_messages=32)] == [sent.id]


async def test_a_deleted_hint_is_replaced(
    producer: Producer, raw: QueueClient, queue_settings: QueueSettings
) -> None:
    assert await producer.notify()
    await raw.clear_messages()  # as the covered hints' clearing, or an operator, would
    assert await queued_hints(queue_settings) == 0
    assert await producer.notify()
    assert await queued_hints(queue_settings) == 1


async def test_a_delayed_hint_is_its_own_message_and_leaves_the_waiting_one_alone(
    raw: QueueClient, queue_settings: QueueSettings
) -> None:
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        assert await queue.notify()
        assert await queue.notify(delay_seconds=60)
        assert await queue.notify()
    assert await queued_hints(queue_settings) == 2
    assert len(await raw.peek_messages(max_messages=32)) == 1  # the delayed one is not visible


async def test_a_hint_refreshed_after_a_drain_began_is_not_cleared_by_it(
    raw: QueueClient, queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(covered, "COVERED_MARGIN_SECONDS", 0.0)
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        assert await queue.notify()
        drained_from = await next_second()  # the queue took the hint before the drain began
        await asyncio.sleep(1.0)
        assert await queue.notify()  # refreshed after it: a commit the drain may not have seen
        assert await covered.clear_covered(raw, drained_from) == 0
        assert await queued_hints(queue_settings) == 1
        # A drain that began after the refresh covered it.
        assert await covered.clear_covered(raw, await next_second()) == 1
    assert await queued_hints(queue_settings) == 0


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_client_that_may_only_add_hints_sends_one_each_round_and_says_so_once(
    kind: str,
    azurite: Azurite,
    queue_settings: QueueSettings,
    raw: QueueClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a producer signed in with *Storage Queue Data Message Sender* (add only) would: here a
    SAS that allows adding messages and nothing else."""
    await raw.create_queue()
    sas = generate_queue_sas(
        DEV_ACCOUNT,
        queue_settings.queue_name,
        DEV_KEY,
        permission=QueueSasPermissions(add=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    add_only = QueueSettings.load(
        queue_connection=(
            f"QueueEndpoint=http://127.0.0.1:{azurite.queue_port}/{DEV_ACCOUNT};"
            f"SharedAccessSignature={sas}"
        ),
        queue_name=queue_settings.queue_name,
    )
    caplog.set_level(logging.INFO, logger="outbox.wakeup")
    producer = Producer(kind, add_only)
    try:
        for _ in range(3):
            assert await producer.notify()
    finally:
        await producer.close()
    assert producer.queue.refreshes is False
    assert await queued_hints(queue_settings) == 3
    said = [r for r in caplog.records if "may send hints but not update them" in r.getMessage()]
    assert len(said) == 1
    assert "AuthorizationPermissionMismatch" in said[0].getMessage()
    assert sas not in caplog.text
