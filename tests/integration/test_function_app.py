"""The Functions app: indexed as the worker indexes it, invoked with real azure.functions objects
against a real PostgreSQL, a real HTTP receiver and (end to end) a real Azurite queue."""

from __future__ import annotations

import base64
import gc
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest
from azure.storage.queue.aio import QueueClient

import outbox
from outbox.azure import functions as relay_functions
from outbox.core.errors import OutboxError
from outbox.core.settings import QueueSettings
from outbox.transport.wakeup import WakeUpQueue
from tests.support import indexing
from tests.support.azure import free_port
from tests.support.outbox_helpers import peek_hints, row, seed, statuses, steady_arrivals
from tests.support.receiver import Receiver, Reply

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def functions() -> dict[str, Any]:
    return indexing.index()  # once: the worker indexes the app once per process


def test_exactly_the_contracted_functions_and_bindings(functions: dict[str, Any]) -> None:
    indexing.check(functions)
    http = [
        name for name, f in functions.items() if indexing.bindings(f)[0]["type"] == "httpTrigger"
    ]
    assert sorted(http) == [
        "outbox_actions",
        "outbox_cancel",
        "outbox_console",
        "outbox_drain",
        "outbox_endpoints",
        "outbox_message",
        "outbox_messages",
        "outbox_overview",
        "outbox_pause",
        "outbox_probe",
        "outbox_replay",
        "outbox_requeue",
        "outbox_resend",
        "outbox_resume",
        "outbox_status",
    ]
    for name in http:  # the console's page alone holds no data
        wanted = "ANONYMOUS" if name == "outbox_console" else "FUNCTION"
        assert indexing.bindings(functions[name])[0]["authLevel"] == wanted


def test_importing_and_indexing_needs_no_settings_and_connects_to_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.indexing"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"]},  # no database, no storage, no webhooks
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "indexed 18 functions" in result.stdout


async def test_queue_function_drains(db: Any, receiver: Receiver, app_env: None) -> None:
    [message_id] = await seed(db)
    hint = QueueMessage(id="m1", body=b'{"requestedAt": "2026-01-01T00:00:00Z"}', dequeue_count=1)
    await relay_functions.outbox_queue(hint)
    assert receiver.to("/orders")[0].webhook_id == str(message_id)
    assert (await row(db, message_id))["status"] == "Processed"


@pytest.mark.parametrize(
    "body",
    [b"", b"not json at all", b"\xff\xfe\x00garbage", b"[1, 2, 3]", b"x" * 70_000, b"[" * 40_000],
)
async def test_a_garbage_hint_still_succeeds_and_drains(
    db: Any, receiver: Receiver, app_env: None, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await seed(db, 2)
    await relay_functions.outbox_queue(QueueMessage(id="junk", body=body, dequeue_count=3))
    assert await statuses(db) == {"Processed": 2}
    [logged] = [r.getMessage() for r in caplog.records if "wake-up hint junk" in r.getMessage()]
    assert len(logged) < 400  # the content is logged, bounded


async def test_a_hint_s_drain_ends_once_caught_up_under_steady_arrivals(
    db: Any,
    receiver: Receiver,
    app_env: None,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Under steady load every lease finds a row; a hint's drain must still end soon, or the
    # instance takes no other hint for a whole budget while they queue up (and drive scale-out).
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("OUTBOX_RUN_BUDGET_SECONDS", "20")
    receiver.script("/orders", then=Reply(200, delay=0.05))
    async with steady_arrivals(database_url):
        await seed(db, 1)
        await relay_functions.outbox_queue(QueueMessage(id="steady", body=b"{}", dequeue_count=1))
    [summary] = [r.getMessage() for r in caplog.records if "trigger=queue" in r.getMessage()]
    assert "stopped_by=drained" in summary


async def test_timer_function_drains(db: Any, receiver: Receiver, app_env: None) -> None:
    await seed(db, 3)
    await relay_functions.outbox_timer(TimerRequest(past_due=True))
    assert len(receiver.to("/orders")) == 3
    assert await statuses(db) == {"Processed": 3}


async def test_timer_function_fails_the_invocation_when_the_database_is_down(
    monkeypatch: pytest.MonkeyPatch, app_env: None
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", f"postgresql://u:pw-123@127.0.0.1:{free_port()}/x")
    with pytest.raises(OutboxError, match="scheduled outbox drain failed: database error") as info:
        await relay_functions.outbox_timer(TimerRequest())
    assert "pw-123" not in str(info.value)


def drain_request(params: dict[str, str] | None = None, body: bytes = b"") -> func.HttpRequest:
    return func.HttpRequest(
        method="POST", url="/api/outbox/drain", headers={}, params=params or {}, body=body
    )


async def test_http_drain_answers_200_with_the_summary(
    db: Any, receiver: Receiver, app_env: None
) -> None:
    await seed(db, 4)
    receiver.script("/orders", Reply(500))
    response = await relay_functions.outbox_drain(drain_request({"budget_seconds": "20"}))
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    summary = json.loads(response.get_body())
    assert (summary["leased"], summary["processed"], summary["retried"]) == (4, 3, 1)
    assert summary["error"] is None


async def test_http_drain_accepts_the_budget_in_a_json_body(
    db: Any, receiver: Receiver, app_env: None
) -> None:
    await seed(db)
    response = await relay_functions.outbox_drain(drain_request(body=b'{"budget_seconds": 5}'))
    assert response.status_code == 200
    assert json.loads(response.get_body())["processed"] == 1


@pytest.fixture
def app_queue(
    app_env: None, queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> QueueSettings:
    """The app's wake-up queue, as its settings name it: this test's own queue on Azurite."""
    monkeypatch.setenv("AzureWebJobsStorage", queue_settings.queue_connection.get_secret_value())
    monkeypatch.setenv("OUTBOX_QUEUE_NAME", queue_settings.queue_name)
    return queue_settings


async def test_a_drain_that_gives_messages_back_at_its_budget_sends_a_hint_for_them(
    db: Any, receiver: Receiver, app_queue: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leased but not sent when the budget ended: due now, and another drain should take them
    # without waiting for the timer (the run's own hint, if any, is used up).
    queue_settings = app_queue
    monkeypatch.setenv("OUTBOX_CONCURRENCY", "1")
    receiver.script("/orders", then=Reply(200, delay=0.4))
    await seed(db, 5)
    response = await relay_functions.outbox_drain(drain_request({"budget_seconds": "0.5"}))
    summary = json.loads(response.get_body())
    assert (summary["stopped_by"], summary["released"] >= 1) == ("budget", True)
    assert len(await peek_hints(queue_settings)) == 1
    # A drain that ends caught up gives nothing back and sends nothing.
    receiver.script("/orders")
    await relay_functions.outbox_drain(drain_request())
    assert len(await peek_hints(queue_settings)) == 1
    assert await statuses(db) == {"Processed": 5}


@pytest.mark.parametrize(
    ("params", "body", "error"),
    [
        ({"budget_seconds": "soon"}, b"", "budget_seconds must be a number of seconds"),
        ({"budget_seconds": "0"}, b"", "budget_seconds must be greater than 0 and at most 120"),
        ({"budget_seconds": "-3"}, b"", "budget_seconds must be greater than 0 and at most 120"),
        ({"budget_seconds": "121"}, b"", "budget_seconds must be greater than 0 and at most 120"),
        ({"budget_seconds": "nan"}, b"", "budget_seconds must be greater than 0 and at most 120"),
        ({"budget_seconds": "inf"}, b"", "budget_seconds must be greater than 0 and at most 120"),
        ({"batch": "5"}, b"", "unknown parameter(s): batch"),
        ({}, b"{not json", "the request body must be empty or a JSON object"),
        ({}, b"[1]", "the request body must be empty or a JSON object"),
        ({}, b'{"budget_seconds": true}', "budget_seconds must be a number of seconds"),
        ({}, b'{"budget_seconds": "x"}', "budget_seconds must be a number of seconds"),
        (
            {},
            b'{"budget_seconds": ' + b"9" * 400 + b"}",
            "budget_seconds must be greater than 0 and at most 120",
        ),
        ({}, b'{"limit": 3}', "unknown field(s) in the body: limit"),
        ({}, b"[" * 40_000, "the request body must be empty or a JSON object"),
        (
            {"budget_seconds": "5"},
            b'{"budget_seconds": 5}',
            "give budget_seconds in the query or in the body, not both",
        ),
    ],
)
async def test_http_drain_rejects_bad_parameters_with_400(
    db: Any, app_env: None, params: dict[str, str], body: bytes, error: str
) -> None:
    await seed(db)
    response = await relay_functions.outbox_drain(drain_request(params, body))
    assert response.status_code == 400
    assert json.loads(response.get_body()) == {"error": error}
    assert await statuses(db) == {"Pending": 1}  # nothing was drained


async def test_http_drain_reports_a_database_outage_as_503_without_details(
    monkeypatch: pytest.MonkeyPatch, app_env: None
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", f"postgresql://u:pw-123@127.0.0.1:{free_port()}/x")
    response = await relay_functions.outbox_drain(drain_request())
    assert response.status_code == 503
    text = response.get_body().decode()
    assert json.loads(text)["error"] == "database error; see the function logs"
    assert "pw-123" not in text
    assert "127.0.0.1" not in text
    assert "Traceback" not in text


async def test_http_drain_reports_bad_settings_as_500_without_details(
    monkeypatch: pytest.MonkeyPatch, app_env: None
) -> None:
    monkeypatch.setenv(
        "OUTBOX_WEBHOOKS", '{"A": {"url": "https://x", "secret": "whsec_oops-leak"}}'
    )
    response = await relay_functions.outbox_drain(drain_request())
    assert response.status_code == 500
    text = response.get_body().decode()
    assert json.loads(text) == {"error": "the relay is misconfigured; see the function logs"}
    assert "oops-leak" not in text


async def test_clients_are_created_once_per_process_and_reused(
    db: Any, receiver: Receiver, app_env: None
) -> None:
    from outbox.azure.host import functions_host
    from outbox.relay.runtime import YOUNG_COLLECTION_THRESHOLD

    await seed(db)
    kept = gc.get_threshold()
    await functions_host.close()
    gc.set_threshold(700, *kept[1:])  # the interpreter's default
    try:
        await relay_functions.outbox_timer(TimerRequest())
        # The worker process hosts the relay: its collector is set for it (runtime.py).
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
    finally:
        gc.set_threshold(*kept)
    first = await functions_host.relay()
    await relay_functions.outbox_drain(drain_request())
    await relay_functions.outbox_queue(QueueMessage(id="x", body=b"{}", dequeue_count=1))
    again = await functions_host.relay()
    assert again is first
    assert again.pool is first.pool
    assert again.publisher is first.publisher


async def test_end_to_end_through_azurite(
    db: Any, receiver: Receiver, app_queue: QueueSettings
) -> None:
    queue_settings = app_queue
    # Producer: business write and outbox row in one transaction, then the hint.
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    async with WakeUpQueue.from_settings() as queue:
        async with outbox.transaction(db, queue) as tx:
            await db.execute("INSERT INTO orders VALUES (42)")
            message_id = await tx.enqueue("OrderCompleted", {"orderId": 42})
    # The message on the queue is base64 of a small JSON object, as the trigger expects.
    raw_client = QueueClient.from_connection_string(
        queue_settings.queue_connection.get_secret_value(), queue_settings.queue_name
    )
    async with raw_client:
        [message] = [m async for m in raw_client.receive_messages(visibility_timeout=30)]
        decoded = base64.b64decode(message.content, validate=True)
        assert set(json.loads(decoded)) == {"requestedAt"}
        # The host hands the decoded body to the function; on success it deletes the message.
        await relay_functions.outbox_queue(
            QueueMessage(
                id=message.id,
                body=decoded,
                dequeue_count=message.dequeue_count,
                pop_receipt=message.pop_receipt,
            )
        )
        await raw_client.delete_message(message)
        assert [m async for m in raw_client.receive_messages()] == []
    [request] = receiver.to("/orders")
    assert request.webhook_id == str(message_id)
    assert request.json["data"] == {"orderId": 42}
    assert (await row(db, message_id))["status"] == "Processed"


@pytest.mark.parametrize(
    ("route", "query", "error"),
    [
        (
            "drain",
            "budget_seconds=5&budget_seconds=6",
            "parameter(s) given more than once: budget_seconds",
        ),
        ("drain", "code=a", "send the key in the x-functions-key header, not in the address"),
        ("status", "verbose=1", "unknown parameter(s): verbose"),
        ("status", "code=a&code=b", "parameter(s) given more than once: code"),
    ],
)
async def test_query_parameters_are_taken_once_each_and_only_known_ones(
    db: Any, app_env: None, route: str, query: str, error: str
) -> None:
    await seed(db)
    function = relay_functions.outbox_drain if route == "drain" else relay_functions.outbox_status
    request = func.HttpRequest(
        method="POST" if route == "drain" else "GET",
        url=f"http://localhost/api/outbox/{route}?{query}",
        headers={},
        params=dict(pair.split("=") for pair in query.split("&")),  # as the binding keeps them
        body=b"",
    )
    response = await function(request)
    assert response.status_code == 400
    assert json.loads(response.get_body()) == {"error": error}
    assert await statuses(db) == {"Pending": 1}


async def test_a_status_request_with_the_function_key_in_the_query_is_answered(
    db: Any, app_env: None
) -> None:
    request = func.HttpRequest(
        method="GET", url="http://localhost/api/outbox/status?code=k", headers={}, body=b""
    )
    assert (await relay_functions.outbox_status(request)).status_code == 200
