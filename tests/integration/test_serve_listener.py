"""``outbox serve``'s queue listener against a real Azurite queue, in process."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any

import azure.functions as func
from azure.core.exceptions import ResourceExistsError, ServiceRequestError

from outbox.core.settings import QueueSettings
from outbox.hosting.serve import Binding, QueueListener, QueueOptions
from outbox.transport.wakeup import make_queue_client


async def test_a_storage_error_after_an_invocation_does_not_stop_the_listener(
    queue_settings: QueueSettings, monkeypatch: Any
) -> None:
    # The host keeps polling whatever storage does; a listener that died here would leave every
    # later hint unread until a restart, with nothing in the log.
    seen: list[bytes] = []

    async def function(message: func.QueueMessage) -> None:
        seen.append(message.get_body())

    binding = Binding("outbox_queue", {"queueName": queue_settings.queue_name}, function)
    listener = QueueListener(
        binding,
        queue_settings,
        QueueOptions(max_polling_interval=0.2, visibility_timeout=1, function_timeout=1),
    )
    delete = listener.queue.delete_message
    failures = [ServiceRequestError("connection reset")]

    async def flaky_delete(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await delete(*args, **kwargs)

    monkeypatch.setattr(listener.queue, "delete_message", flaky_delete)
    sender = make_queue_client(queue_settings, encoded=False)
    stopping = asyncio.Event()
    task = asyncio.create_task(listener.run(stopping))
    try:
        async with sender:
            with contextlib.suppress(ResourceExistsError):  # the listener may have made it
                await sender.create_queue()
            for hint in (b'{"n":1}', b'{"n":2}'):
                await sender.send_message(base64.b64encode(hint).decode())
            # The first delete fails: that hint comes back after its visibility timeout.
            for _ in range(150):
                if len(seen) >= 3:
                    break
                assert not task.done(), task
                await asyncio.sleep(0.1)
        assert not task.done()
        assert len(seen) == 3
        assert set(seen) == {b'{"n":1}', b'{"n":2}'}
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)
        await listener.close()
