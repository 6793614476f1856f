"""A producer's import loads the producer: ``import outbox`` and ``outbox.enqueue`` load no relay,
no HTTP client, no database driver and no Azure SDK (a producer's import time is its service's
cold start); the rest of the package's exports are loaded on first use, and are the same objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import outbox
from outbox.core import errors, models, settings
from outbox.producer import core as producer
from outbox.relay.processor import OutboxProcessor
from outbox.transport.wakeup import WakeUpQueue

ROOT = Path(__file__).resolve().parents[2]

# Every module of the package that a producer's import and its enqueue load.
PRODUCER_MODULES = {
    "outbox",
    "outbox.core",
    "outbox.core.environment",  # OUTBOX_MAX_PAYLOAD_BYTES and OUTBOX_WAKEUP, read at each call
    "outbox.core.errors",
    "outbox.core.ids",  # a generated message id
    "outbox.core.models",
    "outbox.core.telemetry",  # the active span's context, kept with the row
    "outbox.core.text",
    "outbox.producer",
    "outbox.producer.core",
    "outbox.producer.drivers",
    "outbox.store",
    "outbox.store.caller",  # the INSERT and the NOTIFY, run by the caller's driver
    "outbox.store.sql",
}
# Loaded only once used: a connection of theirs passed in, a pydantic model as the payload, a
# wake-up sent to the queue.
NOT_LOADED = (
    "aiohttp",
    "asyncpg",
    "azure",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "sqlalchemy",
    "yarl",
)
PRODUCER = "import outbox\noutbox.enqueue, outbox.transaction, outbox.notify"
SYNC_PRODUCER = (
    "import outbox.sync\noutbox.sync.enqueue, outbox.sync.transaction, outbox.sync.notify"
)
# What enqueue does before the caller's driver runs the INSERT: the checks, the payload's JSON,
# the limit (OUTBOX_MAX_PAYLOAD_BYTES) and the trace context.
PREPARE = (
    "from outbox.producer.core import prepare\n"
    "prepare('OrderCompleted', {'orderId': 42}, None, 'order-42', None)"
)


def loaded(*statements: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``statements``."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("OUTBOX_")}
    code = "\n".join(["import json, sys", *statements, "print(json.dumps(sorted(sys.modules)))"])
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    modules: list[str] = json.loads(done.stdout)
    return modules


def of_the_package(modules: list[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] == "outbox"}


def heavy(modules: list[str]) -> list[str]:
    return [name for name in modules if name.split(".")[0] in NOT_LOADED]


def test_a_producers_import_loads_the_producer_and_nothing_of_the_relay() -> None:
    modules = loaded(PRODUCER)
    assert of_the_package(modules) == PRODUCER_MODULES
    assert heavy(modules) == []


def test_a_producers_enqueue_of_a_dict_loads_no_driver_pydantic_or_azure_sdk() -> None:
    modules = loaded(PRODUCER, PREPARE)
    assert of_the_package(modules) == PRODUCER_MODULES
    assert heavy(modules) == []


def test_a_synchronous_producers_import_loads_its_producer_alone() -> None:
    modules = loaded(SYNC_PRODUCER)
    assert of_the_package(modules) == PRODUCER_MODULES | {"outbox.sync", "outbox.producer.sync"}
    assert heavy(modules) == []


def test_every_export_is_its_modules_own_object_once_used() -> None:
    assert outbox.__all__ == [
        "ConfigurationError",
        "DrainSummary",
        "DuplicateMessageError",
        "InvalidMessageError",
        "OutboxError",
        "OutboxProcessor",
        "OutdatedSchemaError",
        "QueueSettings",
        "Settings",
        "Status",
        "TransactionRequiredError",
        "WakeUpQueue",
        "enqueue",
        "inbox",
        "notify",
        "sync",
        "transaction",
    ]
    assert set(outbox.__all__) <= set(dir(outbox))
    assert outbox.InvalidMessageError is errors.InvalidMessageError
    assert issubclass(outbox.TransactionRequiredError, outbox.OutboxError)
    assert outbox.enqueue is producer.enqueue
    assert outbox.transaction is producer.transaction
    assert outbox.notify is producer.notify
    assert outbox.Settings is settings.Settings
    assert outbox.Status is models.Status
    assert outbox.OutboxProcessor is OutboxProcessor
    assert outbox.WakeUpQueue is WakeUpQueue
    assert outbox.sync is sys.modules["outbox.sync"]
    assert outbox.inbox.claim is sys.modules["outbox.producer.inbox"].claim


def test_a_name_the_package_does_not_export_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="enqeue"):
        outbox.enqeue  # type: ignore[attr-defined]  # noqa: B018
