"""The service's own tests, as a user of outbox-relay writes them with outbox.testing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from orders import SCHEMA, complete_order, complete_order_sync
from receiver import SECRET, handle
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from outbox import testing


async def test_completing_an_order_enqueues_order_completed(conn: Any) -> None:
    async with conn.transaction():
        await complete_order(conn, 42)
        # Seen in the transaction itself, before it commits.
        [event] = await testing.assert_enqueued(
            conn, "OrderCompleted", {"orderId": 42, "customer": "Ada"}, ordering_key="order-42"
        )
    assert event.status == "Pending"


async def test_a_failed_business_write_enqueues_nothing(conn: Any) -> None:
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await complete_order(conn, 42)
            raise RuntimeError("the order could not be completed")
    await testing.refute_enqueued(conn)


async def test_the_assertion_says_what_was_enqueued_when_it_fails(conn: Any) -> None:
    async with conn.transaction():
        await complete_order(conn, 42)
        with pytest.raises(AssertionError, match=r"OrderCompleted \{\"customer\": \"Ada\""):
            await testing.assert_enqueued(conn, "OrderCompleted", {"orderId": 7})
        await testing.assert_enqueued(conn, "OrderCompleted", lambda p: p["orderId"] > 40)


async def test_with_sqlalchemy_too(outbox_database_url: str, conn: Any) -> None:
    url = outbox_database_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)
    try:
        async with AsyncSession(engine) as session, session.begin():
            await complete_order(session, 42)
            await testing.assert_enqueued(
                session, "OrderCompleted", {"orderId": 42, "customer": "Ada"}
            )
            rows = await session.execute(text("SELECT status FROM orders"))
            assert rows.scalar_one() == "completed"
    finally:
        await engine.dispose()


def test_with_psycopg_synchronously(outbox_database_url: str) -> None:
    with psycopg.connect(outbox_database_url) as db:
        db.execute(SCHEMA)
        db.execute("INSERT INTO orders (order_id, customer) VALUES (42, 'Ada')")
        complete_order_sync(db, 42)
        [event] = testing.assert_enqueued_sync(db, "OrderCompleted")
        assert event.payload == {"orderId": 42, "customer": "Ada"}


async def test_the_receiver_accepts_exactly_what_the_relay_would_send(conn: Any) -> None:
    async with conn.transaction():
        await complete_order(conn, 42)
    [event] = await testing.enqueued(conn, "OrderCompleted")
    request = testing.webhook(event, secret=SECRET)
    assert request.headers["webhook-id"] == str(event.message_id)
    assert handle(request.body, request.headers) == (204, "shipping order 42 to Ada")
    forged = testing.webhook(event, secret="whsec_b3RoZXItc2VjcmV0LW9mLXNvbWVib2R5LWVsc2U=")
    assert handle(forged.body, forged.headers)[0] == 401


async def test_the_real_relay_delivers_it_to_the_receiver(
    outbox_database_url: str, conn: Any
) -> None:
    async with conn.transaction():
        await complete_order(conn, 42)
    answers: list[str] = []

    def partner(request: testing.Received) -> int:
        status, done = handle(request.body, request.headers)
        answers.append(done)
        return status

    received = await testing.drain(outbox_database_url, {"OrderCompleted": partner}, secret=SECRET)
    assert [r.json["data"] for r in received] == [{"orderId": 42, "customer": "Ada"}]
    assert answers == ["shipping order 42 to Ada"]
    [event] = await testing.enqueued(conn, "OrderCompleted")
    assert event.status == "Processed"
