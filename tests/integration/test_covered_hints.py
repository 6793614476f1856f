"""Hints a caught-up drain covered are deleted after it, the rest left where they are (real
Azurite, PostgreSQL and receiver): a steady producer's hints no longer pile up in the queue that
Flex Consumption scales the queue trigger on."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
from typing import Any

import pytest
from azure.functions.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from outbox.azure import functions as relay_functions
from outbox.core.settings import QueueSettings
from outbox.transport import covered
from outbox.transport.wakeup import hint_message, make_queue_client, notify_once
from tests.support.outbox_helpers import eventually, queued_hints, seed
from tests.support.receiver import Receiver


def stored(content: dict[str, Any] | str) -> str:
    text = content if isinstance(content, str) else json.dumps(content)
    return base64.b64encode(text.encode()).decode()


async def next_second() -> float:
    """Sleep into the next whole second (the queue keeps insertion times to the second); now."""
    await asyncio.sleep(math.ceil(time.time()) - time.time() + 0.1)
    return time.time()


async def contents(client: QueueClient) -> list[str]:
    return [m.content for m in await client.peek_messages(max_messages=32)]


async def test_hints_sent_before_a_drain_began_are_deleted_and_later_ones_kept(
    queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(covered, "COVERED_MARGIN_SECONDS", 0.0)
    raw = make_queue_client(queue_settings, encoded=False)
    async with raw:
        assert await notify_once(queue_settings)  # creates the queue
        for _ in range(70):  # more than two peeks' worth, as many producer processes send them
            await raw.send_message(stored(hint_message()))
        await raw.send_message("not base64, not ours")  # counted from when the queue took it
        wakes_later = stored({"requestedAt": "x", "wakeAt": "2999-01-01T00:00:00+00:00"})
        await raw.send_message(wakes_later)  # visible now, but asks for a run far later
        drained_from = await next_second()
        await asyncio.sleep(1.0)
        after = stored({"requestedAt": "after the drain began"})
        await raw.send_message(after)
        before = await queued_hints(queue_settings)
        assert await covered.clear_covered(raw, drained_from) == before - 2
        # Left as they were: visible (a peek sees them), neither hidden nor counted as dequeued.
        assert await contents(raw) == [wakes_later, after]
        assert [m.dequeue_count for m in await raw.peek_messages(max_messages=32)] == [0, 0]


async def test_a_queue_trigger_s_drain_clears_the_hints_it_covered(
    db: Any,
    receiver: Receiver,
    app_env: None,
    queue_settings: QueueSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert queue_settings.queue_connection is not None
    monkeypatch.setenv("AzureWebJobsStorage", queue_settings.queue_connection.get_secret_value())
    monkeypatch.setenv("OUTBOX_QUEUE_NAME", queue_settings.queue_name)
    monkeypatch.setattr(covered, "COVERED_MARGIN_SECONDS", 0.0)
    [message_id] = await seed(db)
    assert await notify_once(queue_settings)  # creates the queue
    async with make_queue_client(queue_settings, encoded=False) as producers:
        for _ in range(40):  # one per commit, as 40 producer processes would have sent them
            await producers.send_message(stored(hint_message()))
    assert await queued_hints(queue_settings) == 41
    await next_second()
    raw = make_queue_client(queue_settings, encoded=False)
    async with raw:
        [taken] = [m async for m in raw.receive_messages(max_messages=1, visibility_timeout=30)]
        await relay_functions.outbox_queue(
            QueueMessage(id=taken.id, body=base64.b64decode(taken.content), dequeue_count=1)
        )
        await raw.delete_message(taken)  # as the host does once the function returned
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]

    # The clearing runs beside the invocation, which does not wait for it.
    async def none_left() -> bool:
        return await queued_hints(queue_settings) == 0

    await eventually(none_left)
