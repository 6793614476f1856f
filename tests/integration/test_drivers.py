"""enqueue and transaction through every driver: asyncpg, psycopg and SQLAlchemy, async and sync.

Each test runs once per kind of connection (tests/support/drivers.py) against the real database,
and checks the outcome in the database with a connection of its own.
"""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import outbox
import outbox.sync
from outbox.core.errors import (
    DuplicateMessageError,
    InvalidMessageError,
    OutdatedSchemaError,
    TransactionRequiredError,
)
from outbox.core.settings import QueueSettings
from tests.integration.conftest import Connect
from tests.support.drivers import IMPLICIT_KINDS, KINDS, sqlalchemy_url
from tests.support.outbox_helpers import peek_hints

ALL = sorted(KINDS)


async def counts(db: Any) -> tuple[int, int]:
    """How many orders and outbox rows are committed."""
    orders = await db.fetchval("SELECT count(*) FROM orders")
    return orders, await db.fetchval("SELECT count(*) FROM outbox_messages")


@pytest.mark.parametrize("kind", ALL)
async def test_enqueue_commits_with_the_business_row(
    kind: str, connect: Connect, orders: Any
) -> None:
    caller = await connect(kind)
    async with caller.begin():
        await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
        message_id = await caller.enqueue("OrderCompleted", {"orderId": 1})
    row = await orders.fetchrow(
        "SELECT * FROM outbox_messages WHERE outbox_message_id = $1", message_id
    )
    assert (row["event_type"], row["payload"], row["status"]) == (
        "OrderCompleted",
        '{"orderId": 1}',
        "Pending",
    )
    assert await counts(orders) == (1, 1)


@pytest.mark.parametrize("kind", ALL)
async def test_enqueue_against_an_older_schema_says_to_run_migrate(
    kind: str, connect: Connect, orders: Any
) -> None:
    # The schema before migration 0008, as a database not yet migrated for this package has it.
    await orders.execute("ALTER TABLE outbox_messages DROP COLUMN trace_context")
    caller = await connect(kind)
    with pytest.raises(OutdatedSchemaError) as raised:
        async with caller.begin():
            await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
            await caller.enqueue("OrderCompleted", {"orderId": 1})
    assert str(raised.value) == (
        "the outbox schema is older than this package: run `python -m outbox migrate` (then "
        'deploy producers and relay); column "trace_context" of relation "outbox_messages" '
        "does not exist"
    )
    assert isinstance(raised.value, outbox.OutboxError)
    assert await counts(orders) == (0, 0)


@pytest.mark.parametrize("kind", ALL)
async def test_a_given_id_against_a_schema_before_0019_says_to_run_migrate(
    kind: str, connect: Connect, orders: Any
) -> None:
    # A caller-given id is inserted by outbox_insert_message, which migration 0019 adds.
    await orders.execute("DROP FUNCTION outbox_insert_message")
    caller = await connect(kind)
    with pytest.raises(OutdatedSchemaError) as raised:
        async with caller.begin():
            await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
            await caller.enqueue("OrderCompleted", {"orderId": 1}, message_id=uuid.uuid4())
    assert str(raised.value).startswith(
        "the outbox schema is older than this package: run `python -m outbox migrate`"
    )
    assert "outbox_insert_message" in str(raised.value)
    assert await counts(orders) == (0, 0)


@pytest.mark.parametrize("kind", ALL)
async def test_a_rollback_takes_the_event_with_the_business_row(
    kind: str, connect: Connect, orders: Any
) -> None:
    caller = await connect(kind)
    with pytest.raises(RuntimeError, match="boom"):
        async with caller.begin():
            await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
            await caller.enqueue("OrderCompleted", {"orderId": 1})
            raise RuntimeError("boom")
    assert await counts(orders) == (0, 0)


@pytest.mark.parametrize("kind", ALL)
async def test_a_bad_payload_is_refused_before_anything_is_written_and_the_transaction_goes_on(
    kind: str, connect: Connect, orders: Any
) -> None:
    caller = await connect(kind)
    async with caller.begin():
        await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
        with pytest.raises(InvalidMessageError, match="not JSON-serialisable"):
            await caller.enqueue("OrderCompleted", {"when": object()})
        with pytest.raises(InvalidMessageError, match="NUL character"):
            await caller.enqueue("OrderCompleted", {"name": "a\x00"})
        with pytest.raises(InvalidMessageError, match="event_type contains a surrogate"):
            await caller.enqueue("Order\udcffCompleted", {"orderId": 1})
        with pytest.raises(InvalidMessageError, match="ordering_key contains a control"):
            await caller.enqueue("OrderCompleted", {"orderId": 1}, ordering_key="o\n1")
        with pytest.raises(InvalidMessageError, match="above the limit of 1024"):
            await caller.enqueue("OrderCompleted", {"t": "x" * 2000}, max_payload_bytes=1024)
        # Had any of them reached the database, this transaction would be aborted now.
        await caller.execute("INSERT INTO orders VALUES (2, 'completed')")
        await caller.enqueue("OrderCompleted", {"orderId": 2})
    assert await counts(orders) == (2, 1)


@pytest.mark.parametrize("kind", ALL)
async def test_a_duplicate_message_id_is_refused_and_the_transaction_goes_on(
    kind: str, connect: Connect, orders: Any
) -> None:
    caller = await connect(kind)
    wanted = uuid.uuid4()
    async with caller.begin():
        assert await caller.enqueue("OrderCompleted", {"n": 1}, message_id=wanted) == wanted
        with pytest.raises(DuplicateMessageError, match=str(wanted)):
            await caller.enqueue("OrderCompleted", {"n": 2}, message_id=wanted)
        await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
        await caller.enqueue("OrderCompleted", {"n": 3})
    assert await counts(orders) == (1, 2)
    stored = await orders.fetchval(
        "SELECT payload->>'n' FROM outbox_messages WHERE outbox_message_id = $1", wanted
    )
    assert stored == "1"


@pytest.mark.parametrize("kind", ALL)
async def test_enqueue_where_its_row_would_commit_on_its_own_is_refused(
    kind: str, connect: Connect, orders: Any
) -> None:
    # asyncpg outside conn.transaction(); psycopg and SQLAlchemy in autocommit mode.
    caller = await connect(kind, autocommit=True)
    with pytest.raises(TransactionRequiredError, match="inside the transaction") as refused:
        await caller.enqueue("OrderCompleted", {"orderId": 1})
    assert ".begin()" in str(refused.value) or ".transaction()" in str(refused.value)
    assert await counts(orders) == (0, 0)


@pytest.mark.parametrize("kind", IMPLICIT_KINDS)
async def test_outside_autocommit_enqueue_joins_the_transaction_the_driver_begins(
    kind: str, connect: Connect, orders: Any
) -> None:
    # psycopg (autocommit off) and SQLAlchemy (autobegin) begin a transaction with the first
    # statement, which only the caller's commit commits: the event is atomic with what follows.
    caller = await connect(kind)
    await caller.enqueue("OrderCompleted", {"orderId": 1})
    await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
    assert await counts(orders) == (0, 0)
    await caller.finish(commit=False)
    assert await counts(orders) == (0, 0)
    await caller.enqueue("OrderCompleted", {"orderId": 2})
    await caller.execute("INSERT INTO orders VALUES (2, 'completed')")
    await caller.finish(commit=True)
    assert await counts(orders) == (1, 1)


async def test_every_driver_stores_the_same_row(connect: Connect, orders: Any) -> None:
    payload = {
        "orderId": 7,
        "customer": 'Zoë ✓ "quoted" 100%',
        "lines": [{"sku": "a-1", "qty": 2, "price": 12.5}],
        "placedAt": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "total": Decimal("25.00"),
        "note": None,
    }
    ids = []
    for kind in ALL:
        caller = await connect(kind)
        async with caller.begin():
            ids.append(await caller.enqueue("OrderCompleted", payload, ordering_key="order-7"))
    rows = [
        dict(
            await orders.fetchrow(
                "SELECT *, payload::text AS payload_text FROM outbox_messages "
                "WHERE outbox_message_id = $1",
                message_id,
            )
        )
        for message_id in ids
    ]
    # What differs between rows: the id, the time of the transaction, the place in the key's order.
    varying = {"outbox_message_id", "created_at", "next_attempt_at", "ordering_seq"}
    reference = {k: v for k, v in rows[0].items() if k not in varying}
    assert reference["payload_text"].startswith('{"note": null')
    for kind, row in zip(ALL, rows, strict=True):
        assert {k: v for k, v in row.items() if k not in varying} == reference, kind
        assert row["next_attempt_at"] == row["created_at"], kind  # due now, at its insert
    assert [row["ordering_seq"] for row in rows] == sorted({row["ordering_seq"] for row in rows})


@pytest.mark.parametrize("kind", ALL)
async def test_the_transaction_helper_commits_then_sends_one_hint(
    kind: str, connect: Connect, orders: Any, queue_settings: QueueSettings
) -> None:
    caller = await connect(kind)
    async with caller.transaction(queue_settings) as tx:
        await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
        await tx.enqueue("OrderCompleted", {"orderId": 1})
        await tx.enqueue("OrderShipped", {"orderId": 1})
        assert await peek_hints(queue_settings) == []
    assert await counts(orders) == (1, 2)
    assert len(await peek_hints(queue_settings)) == 1


@pytest.mark.parametrize("kind", ALL)
async def test_the_transaction_helper_refuses_to_run_inside_an_open_transaction(
    kind: str, connect: Connect, orders: Any, queue_settings: QueueSettings
) -> None:
    caller = await connect(kind)
    async with caller.begin():
        await caller.execute("INSERT INTO orders VALUES (1, 'completed')")
        with pytest.raises(TransactionRequiredError, match="notify"):
            async with caller.transaction(queue_settings):
                pass  # pragma: no cover - never entered
        await caller.enqueue("OrderCompleted", {"orderId": 1})  # still usable
    assert await peek_hints(queue_settings) == []
    assert await counts(orders) == (1, 1)


async def test_a_flask_style_scoped_session_is_a_session(database_url: str, orders: Any) -> None:
    engine = create_engine(sqlalchemy_url(database_url, "psycopg"))
    scoped = scoped_session(sessionmaker(engine))
    try:
        with scoped.begin():
            outbox.sync.enqueue(scoped, "OrderCompleted", {"orderId": 1})
    finally:
        scoped.remove()
        engine.dispose()
    assert await counts(orders) == (0, 1)


async def test_a_synchronous_connection_is_sent_to_the_sync_api(database_url: str) -> None:
    conn = psycopg.connect(database_url)
    try:
        with pytest.raises(TypeError, match=r"is synchronous: use outbox\.sync\.enqueue"):
            await outbox.enqueue(conn, "OrderCompleted", {"orderId": 1})
        with pytest.raises(TypeError, match=r"use outbox\.sync\.transaction"):
            async with outbox.transaction(conn):
                pass  # pragma: no cover - never entered
    finally:
        conn.close()


async def test_an_async_connection_is_sent_to_the_awaitable_api(db: Any, database_url: str) -> None:
    with pytest.raises(TypeError, match=r"is asynchronous: use await outbox\.enqueue"):
        outbox.sync.enqueue(db, "OrderCompleted", {"orderId": 1})
    engine = create_async_engine(sqlalchemy_url(database_url, "asyncpg"))
    try:
        async with engine.connect() as conn:
            with pytest.raises(TypeError, match=r"use await outbox\.transaction"):
                with outbox.sync.transaction(conn):
                    pass  # pragma: no cover - never entered
            with pytest.raises(TypeError, match=r"use await outbox\.inbox\.claim"):
                outbox.sync.claim(conn, "msg_1")
    finally:
        await engine.dispose()


async def test_what_is_no_connection_is_refused_by_its_type(database_url: str) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=0, max_size=1)
    engine = create_engine("sqlite://")
    other_database = sqlite3.connect(":memory:")
    try:
        for wrong in (pool, engine, other_database, object()):
            with pytest.raises(TypeError, match=r"outbox\.enqueue needs an asyncpg connection"):
                await outbox.enqueue(wrong, "OrderCompleted", {"orderId": 1})
        with Session(engine) as session, pytest.raises(TypeError, match=r"not sqlite\+pysqlite"):
            outbox.sync.enqueue(session, "OrderCompleted", {"orderId": 1})
    finally:
        await pool.close()
        engine.dispose()
        other_database.close()
