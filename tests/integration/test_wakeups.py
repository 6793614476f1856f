"""Wake-up hints for what comes due later: delayed with the queue's own visibility timeout, one
per run at most, and one after a requeue or a database error (real Azurite, PostgreSQL and
receiver)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import azure.functions as func
import pytest
from azure.functions.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from outbox.azure import functions as relay_functions
from outbox.core.settings import QueueSettings
from outbox.hosting.serve import Binding, QueueListener, QueueOptions
from outbox.transport.wakeup import WakeUpQueue
from tests.support.azure import free_port
from tests.support.outbox_helpers import (
    eventually,
    peek_hints,
    queued_hints,
    run_cli,
    seed,
    statuses,
)
from tests.support.receiver import Receiver, Reply


@pytest.fixture
def app_queue(
    app_env: None, queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> QueueSettings:
    assert queue_settings.queue_connection is not None
    monkeypatch.setenv("AzureWebJobsStorage", queue_settings.queue_connection.get_secret_value())
    monkeypatch.setenv("OUTBOX_QUEUE_NAME", queue_settings.queue_name)
    return queue_settings


async def test_a_delayed_hint_is_invisible_until_its_time_then_the_queue_function_drains(
    db: Any, receiver: Receiver, app_queue: QueueSettings
) -> None:
    [message_id] = await seed(db)
    async with WakeUpQueue.from_settings(app_queue) as queue:
        assert await queue.notify(delay_seconds=5)  # still hidden when peeked, however slow
    assert (await peek_hints(app_queue), await queued_hints(app_queue)) == ([], 1)

    async def visible() -> bool:
        return len(await peek_hints(app_queue)) == 1

    await eventually(visible, timeout=30)
    [hint] = await peek_hints(app_queue)
    assert set(hint) == {"requestedAt", "wakeAt"}
    assert receiver.requests == []
    raw = QueueClient.from_connection_string(
        app_queue.queue_connection.get_secret_value(),  # type: ignore[union-attr]
        app_queue.queue_name,
    )
    async with raw:
        [stored] = [m async for m in raw.receive_messages(visibility_timeout=30)]
        body = base64.b64decode(stored.content, validate=True)
        await relay_functions.outbox_queue(
            QueueMessage(id=stored.id, body=body, dequeue_count=stored.dequeue_count)
        )
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]


async def test_serve_s_listener_takes_a_delayed_hint_once_it_is_due(
    queue_settings: QueueSettings,
) -> None:
    invoked: list[float] = []

    async def function(message: Any) -> None:
        invoked.append(time.monotonic())

    binding = Binding("outbox_queue", {"queueName": queue_settings.queue_name}, function)
    listener = QueueListener(binding, queue_settings, QueueOptions(max_polling_interval=0.2))
    stopping = asyncio.Event()
    task = asyncio.create_task(listener.run(stopping))
    try:
        async with WakeUpQueue.from_settings(queue_settings) as queue:
            sent = time.monotonic()
            assert await queue.notify(delay_seconds=2)

        async def taken() -> bool:
            return bool(invoked)

        await eventually(taken, timeout=30)
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)
        await listener.close()
    assert invoked[0] - sent >= 1.5  # not before the queue made it visible


async def test_a_run_with_a_thousand_retries_due_at_different_times_sends_one_delayed_hint(
    db: Any, receiver: Receiver, app_queue: QueueSettings
) -> None:
    receiver.script("/orders", then=Reply(503))
    await seed(db, 1000)
    await relay_functions.outbox_queue(QueueMessage(id="h", body=b"{}", dequeue_count=1))
    due = await db.fetch("SELECT DISTINCT next_attempt_at FROM outbox_messages")
    assert len(due) > 100  # jittered backoff: due at many different times
    assert await statuses(db) == {"Pending": 1000}
    # One hint for the earliest of them, invisible until then; not one per message.
    assert (await queued_hints(app_queue), await peek_hints(app_queue)) == (1, [])
    # The next run (a sweep, say) finds that hint covering what is due next: no second one.
    await relay_functions.outbox_drain(_http("POST", "drain"))
    assert await queued_hints(app_queue) == 1


async def test_a_requeue_wakes_a_drain_at_once(
    db: Any, receiver: Receiver, app_queue: QueueSettings, database_url: str
) -> None:
    receiver.script("/orders", Reply(410), Reply(410))
    await seed(db, 2)
    await relay_functions.outbox_drain(_http("POST", "drain"))
    assert await statuses(db) == {"Failed": 2}
    assert await queued_hints(app_queue) == 0
    ids = [str(r["outbox_message_id"]) for r in await db.fetch("SELECT * FROM outbox_messages")]
    body = json.dumps({"message_ids": ids[:1]}).encode()
    answered = await relay_functions.outbox_requeue(_http("POST", "requeue", body))
    assert answered.status_code == 200
    assert len(await peek_hints(app_queue)) == 1  # visible now: a drain takes it at once
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "AzureWebJobsStorage": app_queue.queue_connection.get_secret_value(),  # type: ignore[union-attr]
        "OUTBOX_QUEUE_NAME": app_queue.queue_name,
    }
    done = await run_cli("requeue", "--id", ids[1], env=env)
    assert done.returncode == 0, done.stderr
    assert len(await peek_hints(app_queue)) == 2
    dry = await run_cli("requeue", "--all-failed", "--dry-run", env=env)
    assert dry.returncode == 0
    assert len(await peek_hints(app_queue)) == 2  # a dry run wakes nothing


async def test_a_run_that_ends_on_a_database_error_wakes_a_run_30_s_later(
    app_queue: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", f"postgresql://u@127.0.0.1:{free_port()}/x")
    await relay_functions.outbox_queue(QueueMessage(id="h", body=b"{}", dequeue_count=1))
    # One hint, not visible yet: it wakes a run 30 s later, when the database may be back.
    assert (await queued_hints(app_queue), await peek_hints(app_queue)) == (1, [])


def _http(method: str, route: str, body: bytes = b"") -> func.HttpRequest:
    return func.HttpRequest(
        method=method, url=f"/api/outbox/{route}", headers={}, params={}, body=body
    )
