"""The wake-up queue's two clients, the async one and the synchronous one, share how settings
make a client and how a misconfigured queue is reported (``outbox.transport.wakeup``)."""

from __future__ import annotations

import logging
import sys

import pytest
from azure.storage.queue import QueueClient as SyncQueueClient
from azure.storage.queue.aio import QueueClient

from outbox.core.errors import ConfigurationError
from outbox.core.settings import QueueSettings
from outbox.transport import sync_wakeup, wakeup

CLIENTS = [
    pytest.param(wakeup.WakeUpQueue, QueueClient, "azure.identity.aio", id="async"),
    pytest.param(sync_wakeup.WakeUpQueue, SyncQueueClient, "azure.identity", id="sync"),
]
CONNECTION = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
    "QueueEndpoint=http://127.0.0.1:1/devstoreaccount1;"
)


@pytest.fixture(autouse=True)
def no_queue_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AzureWebJobsStorage", "OUTBOX_QUEUE_NAME"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("hints", "kind", "identity"), CLIENTS)
def test_each_client_is_made_of_its_own_kind_from_a_connection_string(
    hints: type[wakeup.HintClient[object]], kind: type, identity: str
) -> None:
    queue = hints.from_settings(QueueSettings.load(queue_connection=CONNECTION, queue_name="q-1"))
    assert type(queue.client) is kind
    assert queue.client.queue_name == "q-1"


@pytest.mark.parametrize(("hints", "kind", "identity"), CLIENTS)
def test_both_clients_refuse_a_bad_connection_string_alike_without_quoting_it(
    hints: type[wakeup.HintClient[object]], kind: type, identity: str
) -> None:
    settings = QueueSettings.load(queue_connection="AccountKey=s3cr3t;garbage")
    with pytest.raises(ConfigurationError) as info:
        hints.from_settings(settings)
    assert str(info.value) == wakeup.BAD_CONNECTION_STRING


@pytest.mark.parametrize(("hints", "kind", "identity"), CLIENTS)
def test_both_clients_say_an_identity_needs_azure_identity(
    monkeypatch: pytest.MonkeyPatch,
    hints: type[wakeup.HintClient[object]],
    kind: type,
    identity: str,
) -> None:
    monkeypatch.setitem(sys.modules, identity, None)  # as if the extra were not installed
    with pytest.raises(ConfigurationError) as info:
        hints.from_settings(QueueSettings.load(queue_account_name="account"))
    assert str(info.value) == wakeup.NEEDS_IDENTITY


@pytest.mark.parametrize(("hints", "kind", "identity"), CLIENTS)
def test_a_client_for_one_hint_without_a_queue_is_none_and_one_warning(
    caplog: pytest.LogCaptureFixture,
    hints: type[wakeup.HintClient[object]],
    kind: type,
    identity: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox.wakeup"):
        assert hints.for_one_hint(QueueSettings.load()) is None
    [record] = caplog.records
    assert "wake-up hint not sent" in record.getMessage()
    assert "no wake-up queue configured" in record.getMessage()
