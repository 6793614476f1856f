"""``python -m outbox serve`` as a user runs it: a child process hosting the app's functions
against a real PostgreSQL, a real Azurite queue and a real webhook receiver."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from azure.storage.queue.aio import QueueClient

from outbox.azure import functions
from outbox.core.settings import QueueSettings
from outbox.hosting.ncrontab import Schedule
from outbox.hosting.serve import index
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import eventually, run_cli, seed, statuses
from tests.support.processes import ROOT, Child
from tests.support.receiver import Receiver, Reply

KEY = "serve-test-function-key-0123456789"
# Longer than any test here takes, with room for a busy machine.
TIMER_MARGIN_SECONDS = 30.0


async def clear_of_the_timers() -> None:
    """Wait, if need be, until no timer of the app fires within the margin.

    The five-minute sweep drains what a test has just written when a test runs across its
    firing, and the test, which expects the hint or an HTTP call to take it, fails.
    """
    schedules = [
        Schedule.parse(binding.trigger["schedule"])
        for binding in index(functions.app())
        if binding.trigger["type"] == "timerTrigger"
    ]
    now = datetime.now(UTC)
    soonest = min(schedule.next_after(now) for schedule in schedules)
    wait = (soonest - now).total_seconds()
    if wait < TIMER_MARGIN_SECONDS:
        await asyncio.sleep(wait + 3)  # the child starts after the firing


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
        "OUTBOX_CONCURRENCY": "2",
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


@asynccontextmanager
async def serving(
    serve_env: dict[str, str], tmp_path: Path, *options: str
) -> AsyncIterator[tuple[Child, str]]:
    # host.json as shipped, except that a failed message is retried at once (the test waits).
    host = json.loads((ROOT / "host.json").read_text())
    host["extensions"]["queues"]["visibilityTimeout"] = "00:00:00"
    host_json = tmp_path / "host.json"
    host_json.write_text(json.dumps(host))
    await clear_of_the_timers()
    port = free_port()
    child = await Child.start(
        "outbox",
        "serve",
        "--port",
        str(port),
        "--host-json",
        str(host_json),
        *options,
        env=serve_env,
    )
    try:
        await child.wait_for_line(r"serving 18 functions")
        await child.wait_for_line(r"outbox\.drain trigger=startup")  # what waited, taken
        yield child, f"http://127.0.0.1:{port}/api/outbox"
    finally:
        await child.kill()


@pytest.fixture
async def served(serve_env: dict[str, str], tmp_path: Path) -> AsyncIterator[tuple[Child, str]]:
    async with serving(serve_env, tmp_path) as child_and_api:
        yield child_and_api


async def test_on_uvloop_the_same_functions_deliver_and_stop_cleanly(
    db: Any, receiver: Receiver, serve_env: dict[str, str], tmp_path: Path
) -> None:
    async with serving(serve_env, tmp_path, "--uvloop") as (child, api):
        assert any("event loop uvloop" in line for line in child.lines)
        # What the relay may send at once is on the start-up line (OUTBOX_CONCURRENCY=2 here).
        assert any("at most 2 webhook requests at once" in line for line in child.lines)
        result = await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=serve_env)
        await receiver.wait_for(1, timeout=30)
        assert receiver.requests[0].webhook_id == json.loads(result.stdout)["message_id"]
        await seed(db, 3)
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{api}/drain", headers={"x-functions-key": KEY}) as response,
        ):
            assert (await response.json())["processed"] == 3
        child.process.send_signal(signal.SIGTERM)
        assert await child.stop(timeout=60) == 0
    assert await statuses(db) == {"Processed": 4}


async def test_a_committed_event_arrives_through_the_hint_path(
    db: Any, receiver: Receiver, served: tuple[Child, str], serve_env: dict[str, str]
) -> None:
    child, _ = served
    assert any("event loop asyncio" in line for line in child.lines)
    result = await run_cli("enqueue", "OrderCompleted", '{"orderId": 1}', env=serve_env)
    message_id = json.loads(result.stdout)["message_id"]
    await receiver.wait_for(1, timeout=30)
    assert receiver.requests[0].webhook_id == message_id
    await child.wait_for_line(r"outbox\.drain trigger=queue .*processed=1")
    assert await statuses(db) == {"Processed": 1}


async def test_http_functions_need_the_function_key(
    db: Any, receiver: Receiver, served: tuple[Child, str]
) -> None:
    _, api = served
    await seed(db, 2)
    async with aiohttp.ClientSession() as http:
        for headers, params in [({}, {}), ({"x-functions-key": "wrong"}, {}), ({}, {"code": "x"})]:
            async with http.post(f"{api}/drain", headers=headers, params=params) as response:
                assert response.status == 401
        assert receiver.requests == []
        async with http.post(f"{api}/drain", headers={"x-functions-key": KEY}) as response:
            assert response.status == 200
            assert (await response.json())["processed"] == 2
        async with http.get(f"{api}/status", params={"code": KEY}) as response:
            assert response.status == 200
            assert (await response.json())["counts"]["Processed"] == 2
        async with http.post(
            f"{api}/drain", params={"code": KEY, "budget_seconds": "x"}
        ) as response:
            assert response.status == 400


async def test_a_message_that_keeps_failing_ends_in_the_poison_queue(
    served: tuple[Child, str], queue_settings: QueueSettings
) -> None:
    child, _ = served
    connection = queue_settings.queue_connection
    assert connection is not None
    raw = QueueClient.from_connection_string(
        connection.get_secret_value(), queue_settings.queue_name
    )
    poison = QueueClient.from_connection_string(
        connection.get_secret_value(), f"{queue_settings.queue_name}-poison"
    )
    async with raw, poison:
        await raw.send_message("this is not base64!")  # the trigger cannot decode it

        async def poisoned() -> bool:
            try:
                return len(await poison.peek_messages()) == 1
            except Exception:  # noqa: BLE001 - the poison queue does not exist yet
                return False

        await eventually(poisoned, timeout=60)
        [moved] = await poison.peek_messages()
        assert moved.content == "this is not base64!"
        assert await raw.peek_messages() == []
    failures = [line for line in child.lines if "outbox_queue failed on message" in line]
    assert [f.split("(dequeue ")[1][0] for f in failures] == ["1", "2", "3", "4", "5"]


async def test_sigterm_finishes_in_flight_deliveries_and_leaves_no_row_processing(
    db: Any, receiver: Receiver, served: tuple[Child, str]
) -> None:
    child, api = served
    release = asyncio.Event()
    receiver.script("/orders", then=Reply(200, hold=release))
    await seed(db, 6)
    async with aiohttp.ClientSession() as http:
        drain = asyncio.create_task(http.post(f"{api}/drain", headers={"x-functions-key": KEY}))
        await eventually(lambda: receiver.in_flight == 2)  # OUTBOX_CONCURRENCY=2
        child.process.send_signal(signal.SIGTERM)
        await child.wait_for_line("stopping: finishing in-flight deliveries")
        release.set()
        assert await child.stop(timeout=60) == 0
        drain.cancel()
    assert len(receiver.requests) == 2
    assert await statuses(db) == {"Processed": 2, "Pending": 4}
    pending = await db.fetch("SELECT attempt_count FROM outbox_messages WHERE status = 'Pending'")
    assert {r["attempt_count"] for r in pending} == {0}  # released, not counted as attempts
