"""outbox.sync.notify: the wake-up hint from synchronous code, against a real Azurite."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from azure.storage.queue import QueueClient

import outbox.sync
from outbox.core.settings import QueueSettings
from tests.support.azure import connection_string, free_port
from tests.support.outbox_helpers import peek_hints

ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6"  # part of Azurite's well-known key


def raw_contents(queue_settings: QueueSettings) -> list[str]:
    """The messages on the queue as stored, without the base64 decoding of the hint's client."""
    assert queue_settings.queue_connection is not None
    with QueueClient.from_connection_string(
        queue_settings.queue_connection.get_secret_value(), queue_settings.queue_name
    ) as client:
        return [message.content for message in client.peek_messages(max_messages=32)]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them) and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def hint_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "wake-up hint not sent" in r.getMessage()]


async def test_sync_notify_creates_the_queue_and_sends_one_base64_json_hint(
    queue_settings: QueueSettings,
) -> None:
    with outbox.sync.WakeUpQueue.from_settings(queue_settings) as queue:
        assert outbox.sync.notify(queue) is True  # the queue did not exist yet
    [decoded] = await peek_hints(queue_settings)
    [raw] = raw_contents(queue_settings)
    assert base64.b64decode(raw) == json.dumps(decoded).encode()
    assert set(decoded) == {"requestedAt"}
    datetime.fromisoformat(decoded["requestedAt"])


async def test_sync_notify_without_a_queue_reads_the_environment_for_one_hint(
    queue_settings: QueueSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert queue_settings.queue_connection is not None
    monkeypatch.setenv("AzureWebJobsStorage", queue_settings.queue_connection.get_secret_value())
    monkeypatch.setenv("OUTBOX_QUEUE_NAME", queue_settings.queue_name)
    assert outbox.sync.notify() is True
    assert outbox.sync.notify() is True
    assert len(await peek_hints(queue_settings)) == 2


async def test_sync_notify_needs_no_event_loop_of_its_own_nor_minds_a_running_one(
    queue_settings: QueueSettings,
) -> None:
    asyncio.get_running_loop()  # this test's: the hint must not try to run one of its own
    with outbox.sync.WakeUpQueue.from_settings(queue_settings) as queue:
        assert outbox.sync.notify(queue) is True
        first_asked = datetime.now(UTC)
        # A worker thread has no event loop at all.
        assert await asyncio.to_thread(outbox.sync.notify, queue) is True
    # The second refreshed the first, still waiting: one hint, asked for by the second.
    [hint] = await peek_hints(queue_settings)
    assert datetime.fromisoformat(hint["requestedAt"]) > first_asked


def test_sync_notify_failure_is_one_warning_without_the_account_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = QueueSettings.load(queue_connection=connection_string(free_port()))
    with caplog.at_level(logging.WARNING), outbox.sync.WakeUpQueue.from_settings(settings) as queue:
        assert outbox.sync.notify(queue) is False
    [record] = hint_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert ACCOUNT_KEY not in caplog.text


def test_sync_notify_without_any_queue_configured_only_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert outbox.sync.notify() is False
    [record] = hint_warnings(caplog)
    assert "no wake-up queue configured" in record.getMessage()


def test_sync_notify_to_a_queue_that_never_answers_gives_up_after_its_timeout(
    silent_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    settings = QueueSettings.load(queue_connection=connection_string(silent_port))
    with caplog.at_level(logging.WARNING), outbox.sync.WakeUpQueue.from_settings(settings) as queue:
        assert outbox.sync.notify(queue) is False
    [record] = hint_warnings(caplog)
    assert "TimeoutError: no answer in 5 s" in record.getMessage()
    assert ACCOUNT_KEY not in caplog.text
