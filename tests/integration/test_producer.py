from __future__ import annotations

import base64
import json
import logging
import sys
import types
import uuid
from datetime import datetime
from typing import Any, ClassVar

import asyncpg
import pytest
from azure.storage.queue.aio import QueueClient
from pydantic import BaseModel, ConfigDict

import outbox
from outbox.core.errors import (
    ConfigurationError,
    DuplicateMessageError,
    InvalidMessageError,
    TransactionRequiredError,
)
from outbox.core.settings import QueueSettings, Settings
from outbox.producer.core import stored_size
from outbox.transport.wakeup import WakeUpQueue
from tests.support.azure import connection_string, free_port
from tests.support.outbox_helpers import peek_hints


class OrderCompleted(BaseModel):
    order_id: int


class Reading(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")
    value: float


class Note(BaseModel):
    text: str


def nested(depth: int) -> dict[str, Any]:
    payload: dict[str, Any] = {}
    for _ in range(depth):
        payload = {"a": payload}
    return payload


@pytest.fixture
async def orders(db: Any) -> Any:
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)")
    return db


async def outbox_rows(db: Any) -> list[Any]:
    return await db.fetch("SELECT * FROM outbox_messages ORDER BY created_at")


async def test_enqueue_writes_a_pending_row_due_now_in_the_callers_transaction(orders: Any) -> None:
    async with orders.transaction():
        await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
        message_id = await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})
    [row] = await outbox_rows(orders)
    assert row["outbox_message_id"] == message_id
    assert row["event_type"] == "OrderCompleted"
    assert row["payload"] == '{"orderId": 1}'
    assert row["status"] == "Pending"
    assert row["attempt_count"] == 0
    assert row["last_error"] is None
    assert await orders.fetchval("SELECT next_attempt_at <= now() FROM outbox_messages")


async def test_generated_ids_are_uuid7_and_sort_in_the_order_they_were_made(db: Any) -> None:
    # Time-ordered ids keep the primary keys' new entries at the right edge of their B-trees.
    made = []
    for i in range(200):
        async with db.transaction():
            made.append(await outbox.enqueue(db, "OrderCompleted", {"orderId": i}))
    assert {m.version for m in made} == {7}
    in_key_order = await db.fetch("SELECT outbox_message_id FROM outbox_messages ORDER BY 1")
    assert [r["outbox_message_id"] for r in in_key_order] == made


async def test_rollback_leaves_neither_the_business_row_nor_the_event(orders: Any) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        async with orders.transaction():
            await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
            await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})
            raise RuntimeError("boom")
    assert await orders.fetchval("SELECT count(*) FROM orders") == 0
    assert await outbox_rows(orders) == []


async def test_a_bad_payload_fails_before_writing_and_the_transaction_stays_usable(
    orders: Any,
) -> None:
    async with orders.transaction():
        await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
        with pytest.raises(InvalidMessageError, match="not JSON-serialisable"):
            await outbox.enqueue(orders, "OrderCompleted", {"when": object()})
        with pytest.raises(InvalidMessageError, match="NUL character"):
            await outbox.enqueue(orders, "OrderCompleted", {"name": "a\x00"})
        with pytest.raises(InvalidMessageError, match="event_type contains a NUL character"):
            await outbox.enqueue(orders, "Order\x00Completed", {"orderId": 1})
        with pytest.raises(InvalidMessageError, match="ordering_key contains a NUL character"):
            await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1}, ordering_key="o\x001")
        with pytest.raises(InvalidMessageError, match="event_type contains a surrogate"):
            await outbox.enqueue(orders, "Order\udcffCompleted", {"orderId": 1})
        with pytest.raises(InvalidMessageError, match="ordering_key contains a surrogate"):
            await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1}, ordering_key="o\udcff1")
        await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})
    assert await orders.fetchval("SELECT count(*) FROM orders") == 1
    assert len(await outbox_rows(orders)) == 1


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (Reading(value=float("inf")), "not JSON-serialisable: Out of range float"),
        ({"name": "a\udcffb"}, "payload contains a surrogate"),
        (Note(text="a\udcffb"), "payload contains a surrogate"),
        (nested(10_000), "payload is nested too deeply"),
    ],
    ids=["infinity in a model", "surrogate in a dict", "surrogate in a model", "deep nesting"],
)
async def test_an_unstorable_payload_is_refused_and_the_transaction_stays_usable(
    orders: Any, payload: Any, expected: str
) -> None:
    async with orders.transaction():
        await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
        with pytest.raises(InvalidMessageError, match=expected):
            await outbox.enqueue(orders, "OrderCompleted", payload)
        await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})
    assert await orders.fetchval("SELECT count(*) FROM orders") == 1
    assert len(await outbox_rows(orders)) == 1


async def test_the_payload_limit_is_the_relay_s_setting_unless_given(
    orders: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {"text": "x" * 1_500_000}  # above the 1 MiB default
    async with orders.transaction():
        with pytest.raises(InvalidMessageError, match="above the limit of 1048576"):
            await outbox.enqueue(orders, "OrderCompleted", big)
        monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "2097152")
        await outbox.enqueue(orders, "OrderCompleted", big)
        monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "2048")
        with pytest.raises(InvalidMessageError, match="above the limit of 2048"):
            await outbox.enqueue(orders, "OrderCompleted", {"text": "x" * 3000})
        monkeypatch.delenv("OUTBOX_MAX_PAYLOAD_BYTES")
        monkeypatch.setenv("outbox_max_payload_bytes", "2048")  # as the relay's Settings read it
        with pytest.raises(InvalidMessageError, match="above the limit of 2048"):
            await outbox.enqueue(orders, "OrderCompleted", {"text": "x" * 3000})
        assert Settings.load(database_url="postgresql://h/db").max_payload_bytes == 2048
        monkeypatch.delenv("outbox_max_payload_bytes")
        # The keyword wins over the setting.
        await outbox.enqueue(orders, "OrderCompleted", {"text": "x" * 3000}, max_payload_bytes=4096)
        monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "lots")
        with pytest.raises(ConfigurationError, match="OUTBOX_MAX_PAYLOAD_BYTES: Input should be"):
            await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})
        await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
    assert await orders.fetchval("SELECT count(*) FROM orders") == 1
    assert len(await outbox_rows(orders)) == 2


async def test_the_payload_limit_applies_to_the_size_the_relay_will_measure(
    orders: Any,
) -> None:
    # jsonb writes 1e+300 in full (301 digits); the relay measures that text at delivery, so
    # enqueue must too, or a payload it accepted would fail later as oversized.
    small_in_python = {"readings": [1e300] * 4, "note": "3e8 in a string stays as it is"}
    async with orders.transaction():
        with pytest.raises(InvalidMessageError, match=r"payload is 1\d{3} bytes, above the limit"):
            await outbox.enqueue(orders, "OrderCompleted", small_in_python, max_payload_bytes=1024)
        message_id = await outbox.enqueue(
            orders, "OrderCompleted", {"n": [1e-07, 2.5e20], "s": "3e8 and 1e+300"}
        )
    stored = await orders.fetchval(
        "SELECT octet_length(payload::text) FROM outbox_messages WHERE outbox_message_id = $1",
        message_id,
    )
    text = json.dumps({"n": [1e-07, 2.5e20], "s": "3e8 and 1e+300"})
    assert stored_size(text, len(text.encode())) == stored == 64


async def test_a_literal_backslash_u0000_in_the_payload_is_stored_as_text(db: Any) -> None:
    async with db.transaction():
        await outbox.enqueue(db, "FileSaved", {"path": "C:\\u0000x"})
    assert await db.fetchval("SELECT payload->>'path' FROM outbox_messages") == "C:\\u0000x"


async def test_enqueue_outside_a_transaction_is_refused(db: Any) -> None:
    with pytest.raises(TransactionRequiredError, match="inside the transaction"):
        await outbox.enqueue(db, "OrderCompleted", {"orderId": 1})
    assert await outbox_rows(db) == []


async def test_pydantic_payload_and_explicit_message_id(db: Any) -> None:
    wanted = uuid.uuid4()
    async with db.transaction():
        got = await outbox.enqueue(
            db, "OrderCompleted", OrderCompleted(order_id=5), message_id=wanted
        )
    assert got == wanted
    assert await db.fetchval("SELECT payload->>'order_id' FROM outbox_messages") == "5"


async def test_duplicate_message_id_is_reported_without_aborting_the_transaction(db: Any) -> None:
    wanted = uuid.uuid4()
    async with db.transaction():
        await outbox.enqueue(db, "OrderCompleted", {"n": 1}, message_id=wanted)
        with pytest.raises(DuplicateMessageError, match=str(wanted)):
            await outbox.enqueue(db, "OrderCompleted", {"n": 2}, message_id=wanted)
        await outbox.enqueue(db, "OrderCompleted", {"n": 3})
    assert await db.fetchval("SELECT count(*) FROM outbox_messages") == 2


async def test_notify_failure_is_a_warning_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn_str = connection_string(free_port())
    queue = WakeUpQueue.from_settings(QueueSettings.load(queue_connection=conn_str))
    with caplog.at_level(logging.WARNING):
        async with queue:
            assert await queue.notify() is False
    [record] = [r for r in caplog.records if "wake-up hint not sent" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6" not in caplog.text


async def test_notify_without_any_queue_configured_only_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert await outbox.notify() is False
    assert "no wake-up queue configured" in caplog.text


class RecordingCredential:
    """Stands in for azure-identity's DefaultAzureCredential: counts what is made and closed."""

    made: ClassVar[list[RecordingCredential]] = []

    def __init__(self) -> None:
        self.closed = False
        RecordingCredential.made.append(self)

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("token", 2**31)

    async def close(self) -> None:
        self.closed = True


async def test_identity_hints_close_the_credential_they_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Closing a QueueClient leaves its credential open; each one holds an HTTP session.
    identity = types.ModuleType("azure.identity.aio")
    identity.DefaultAzureCredential = RecordingCredential  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "azure.identity.aio", identity)
    monkeypatch.setattr(RecordingCredential, "made", [])
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    # Nobody listens there: the hint fails quickly, as far as the credential is concerned alike.
    monkeypatch.setenv("AzureWebJobsStorage__queueServiceUri", f"https://127.0.0.1:{free_port()}")
    assert await outbox.notify() is False
    async with WakeUpQueue.from_settings():
        pass
    assert len(RecordingCredential.made) == 2
    assert all(credential.closed for credential in RecordingCredential.made)
    # A client of the caller's own keeps its credential: the caller may share it.
    theirs = RecordingCredential()
    client = QueueClient("https://acct.queue.core.windows.net", "q", credential=theirs)
    async with WakeUpQueue(client):
        pass
    assert not theirs.closed


async def test_notify_sends_one_base64_json_hint_without_business_data(
    queue_settings: QueueSettings,
) -> None:
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        assert await queue.notify() is True
        [raw] = await queue.client.peek_messages()
    # On the wire the message is base64 text, as the queue trigger expects by default.
    client = QueueClient.from_connection_string(
        queue_settings.queue_connection.get_secret_value(), queue_settings.queue_name
    )
    async with client:
        [plain] = await client.peek_messages()
    assert plain.content == base64.b64encode(raw.content.encode()).decode()
    hint = json.loads(raw.content)
    assert set(hint) == {"requestedAt"}
    datetime.fromisoformat(hint["requestedAt"])


async def test_transaction_helper_commits_then_hints_once(
    orders: Any, queue_settings: QueueSettings
) -> None:
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        async with outbox.transaction(orders, queue) as tx:
            await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
            await tx.enqueue("OrderCompleted", {"orderId": 1})
            await tx.enqueue("OrderShipped", {"orderId": 1})
            assert await peek_hints(queue_settings) == []
    assert len(await outbox_rows(orders)) == 2
    assert len(await peek_hints(queue_settings)) == 1


async def test_transaction_helper_refuses_to_run_inside_another_transaction(
    orders: Any, queue_settings: QueueSettings
) -> None:
    # Inside an outer transaction it would only release a savepoint, and its hint would arrive
    # before the rows were committed: the drain would find nothing.
    async with WakeUpQueue.from_settings(queue_settings) as queue, orders.transaction():
        await orders.execute("INSERT INTO orders VALUES (1, 'completed')")
        with pytest.raises(TransactionRequiredError, match="notify"):
            async with outbox.transaction(orders, queue):
                pass  # pragma: no cover - never entered
        await outbox.enqueue(orders, "OrderCompleted", {"orderId": 1})  # still usable
    assert await peek_hints(queue_settings) == []
    assert len(await outbox_rows(orders)) == 1


async def test_transaction_helper_sends_no_hint_when_rolled_back(
    orders: Any, queue_settings: QueueSettings
) -> None:
    async with WakeUpQueue.from_settings(queue_settings) as queue:
        with pytest.raises(asyncpg.UniqueViolationError):
            async with outbox.transaction(orders, queue) as tx:
                await tx.enqueue("OrderCompleted", {"orderId": 1})
                await orders.execute("INSERT INTO orders VALUES (1, 'a'), (1, 'b')")
    assert await peek_hints(queue_settings) == []
    assert await outbox_rows(orders) == []
