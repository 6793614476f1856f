"""Retries on time under ``outbox serve``, with no five-minute sweep to fall back on: the app
served has no timers, so only a wake-up hint can bring a retry, a requeued message or a backlog
found at start-up to the receiver."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from outbox.core.settings import QueueSettings
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import eventually, run_cli, seed, statuses
from tests.support.processes import Child
from tests.support.receiver import Receiver, Reply

KEY = "retries-on-time-function-key-0123"
# A delivery that only the sweep could make would not come within this (it never runs here).
SLACK_SECONDS = 15


@pytest.fixture
def serve_env(
    database_url: str, receiver: Receiver, queue_settings: QueueSettings, tmp_path: Path
) -> dict[str, str]:
    assert queue_settings.queue_connection is not None
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
        "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
        "OUTBOX_QUEUE_NAME": queue_settings.queue_name,
        "OUTBOX_FUNCTION_KEY": KEY,
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


@pytest.fixture
async def start_serve(
    serve_env: dict[str, str],
) -> AsyncIterator[Callable[[], Any]]:
    children: list[Child] = []

    async def start() -> tuple[Child, str]:
        port = free_port()
        child = await Child.start(
            "outbox", "serve", "--port", str(port), "--app",
            "tests.support.sweepless_app:app", env=serve_env,
        )  # fmt: skip
        children.append(child)
        await child.wait_for_line(r"serving 16 functions")
        return child, f"http://127.0.0.1:{port}/api/outbox"

    yield start
    for child in children:
        await child.kill()


@pytest.mark.slow
async def test_a_retry_is_delivered_when_its_backoff_ends(
    receiver: Receiver, serve_env: dict[str, str], start_serve: Any
) -> None:
    receiver.script("/orders", Reply(503, b"busy"), then=Reply(204))
    await start_serve()
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=serve_env)
    await receiver.wait_for(2, timeout=10 + SLACK_SECONDS + 10)
    first, second = receiver.requests[0].at, receiver.requests[1].at
    assert 8.5 <= second - first <= 10 + SLACK_SECONDS  # the first backoff step: 9 to 10 s


@pytest.mark.slow
async def test_a_retry_after_is_honoured_on_time(
    receiver: Receiver, serve_env: dict[str, str], start_serve: Any
) -> None:
    receiver.script("/orders", Reply(503, headers={"Retry-After": "3"}), then=Reply(204))
    await start_serve()
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 2}', env=serve_env)
    await receiver.wait_for(2, timeout=3 + SLACK_SECONDS + 10)
    assert 2.5 <= receiver.requests[1].at - receiver.requests[0].at <= 3 + SLACK_SECONDS


@pytest.mark.slow
async def test_a_requeued_message_is_delivered_at_once(
    db: Any, receiver: Receiver, serve_env: dict[str, str], start_serve: Any
) -> None:
    receiver.script("/orders", Reply(410, b"gone"), then=Reply(204))
    _, api = await start_serve()
    await run_cli("enqueue", "OrderCompleted", '{"orderId": 3}', env=serve_env)

    async def failed() -> bool:
        return await statuses(db) == {"Failed": 1}

    await eventually(failed, timeout=30)
    async with aiohttp.ClientSession() as http:
        url = f"{api}/requeue"
        async with http.post(url, json={"all_failed": True}, headers={"x-functions-key": KEY}) as r:
            assert (r.status, (await r.json())["requeued"]) == (200, 1)
    await receiver.wait_for(2, timeout=SLACK_SECONDS)

    async def processed() -> bool:  # recorded just after the receiver's answer
        return await statuses(db) == {"Processed": 1}

    await eventually(processed, timeout=SLACK_SECONDS)


@pytest.mark.slow
async def test_rows_due_before_serve_starts_are_delivered_at_start_up(
    db: Any, receiver: Receiver, start_serve: Any
) -> None:
    ids = await seed(db, 5)  # no hint: committed while no relay ran
    child, _ = await start_serve()
    await receiver.wait_for(5, timeout=SLACK_SECONDS)
    assert {r.webhook_id for r in receiver.requests} == {str(i) for i in ids}
    await child.wait_for_line(r"outbox\.drain trigger=startup .*processed=5")
