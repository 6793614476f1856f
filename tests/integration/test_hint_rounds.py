"""Hints asked for while one is on its way go out together, after its answer (or, if it is slow,
after a moment): one message per round trip to the queue instead of one per transaction, and
still one sent after each caller asked (real Azurite, behind a proxy that can hold the queue's
answers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

import outbox.sync
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import ROUND_PATIENCE_SECONDS, WakeUpQueue
from tests.support.azure import connection_string
from tests.support.azurite import Azurite
from tests.support.outbox_helpers import eventually, queued_hints
from tests.support.tcp_proxy import TcpProxy

# A way to send one hint, and the client to close afterwards.
Sender = Callable[[], Coroutine[Any, Any, bool]]


@pytest.fixture
async def proxy(azurite: Azurite) -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy("127.0.0.1", azurite.queue_port).start()
    yield proxy
    proxy.release_answers()
    await proxy.stop()


@pytest.fixture
def proxied(proxy: TcpProxy, queue_settings: QueueSettings) -> QueueSettings:
    """The test's queue, reached through the proxy."""
    return QueueSettings.load(
        queue_connection=connection_string(proxy.port), queue_name=queue_settings.queue_name
    )


async def test_a_hundred_hints_asked_for_at_once_are_one_message(
    queue_settings: QueueSettings,
) -> None:
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        assert await queue.notify()  # the first creates the queue
        sent = await asyncio.gather(*(queue.notify() for _ in range(100)))
    assert sent == [True] * 100
    assert await queued_hints(queue_settings) == 1  # the second round refreshed the first hint


def sync_sender(settings: QueueSettings) -> tuple[Sender, object]:
    queue = outbox.sync.WakeUpQueue.from_settings(settings)

    async def notify() -> bool:
        return await asyncio.to_thread(outbox.sync.notify, queue)

    return notify, queue


async def async_sender(
    settings: QueueSettings,
) -> tuple[Sender, object]:
    queue = WakeUpQueue.from_settings(settings)
    return queue.notify, queue


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_hint_asked_for_while_one_is_on_its_way_waits_for_it_a_moment_then_goes(
    kind: str, proxy: TcpProxy, proxied: QueueSettings, queue_settings: QueueSettings
) -> None:
    notify, queue = sync_sender(proxied) if kind == "sync" else await async_sender(proxied)
    try:
        assert await notify()  # the queue exists; one request, answered
        before = proxy.requests
        proxy.hold_answers()
        first = asyncio.create_task(notify())
        await eventually(lambda: proxy.requests == before + 1)
        later = [asyncio.create_task(notify()) for _ in range(5)]
        await asyncio.sleep(ROUND_PATIENCE_SECONDS / 3)
        # Nothing more goes out while the first send is young and unanswered: a send started now
        # could reach the queue before these callers' commits had, as far as the client can tell.
        assert proxy.requests == before + 1
        assert not any(task.done() for task in later)
        # Once it has been out for the round's patience, the five go out together without it.
        # (The first send refreshes the waiting hint; these send one of their own, since the
        # refresh on its way will change the hint's pop receipt.)
        await eventually(lambda: proxy.requests == before + 2)
        assert not first.done()
        proxy.release_answers()
        assert await first
        assert await asyncio.gather(*later) == [True] * 5
        assert proxy.requests == before + 2
    finally:
        proxy.release_answers()
        closing = queue.close()  # type: ignore[attr-defined]
        if asyncio.iscoroutine(closing):
            await closing
    assert await queued_hints(queue_settings) == 2


async def test_sync_hints_from_many_threads_at_once_are_few_messages(
    queue_settings: QueueSettings,
) -> None:
    with outbox.sync.WakeUpQueue.from_settings(queue_settings) as queue:
        assert outbox.sync.notify(queue)
        sent = await asyncio.gather(
            *(asyncio.to_thread(outbox.sync.notify, queue) for _ in range(40))
        )
    assert sent == [True] * 40
    # Each thread's hint went in the round after the one on its way when it asked, and each
    # round refreshed the hint still waiting: one message, or a few where a round overlapped
    # another that was slow to be answered (each such round sends one of its own).
    assert 1 <= await queued_hints(queue_settings) < 40
