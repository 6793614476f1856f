"""An order service's one operation: complete an order and announce it, in one transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

import outbox
import outbox.sync

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id bigint PRIMARY KEY,
    customer text NOT NULL,
    status   text NOT NULL DEFAULT 'open'
)
"""


async def complete_order(conn: Any, order_id: int) -> None:
    """Mark the order completed and enqueue ``OrderCompleted`` (asyncpg, psycopg's async
    connection or SQLAlchemy's AsyncSession: the caller's transaction is open)."""
    customer = await _customer(conn, order_id)
    await outbox.enqueue(
        conn,
        "OrderCompleted",
        {"orderId": order_id, "customer": customer},
        ordering_key=f"order-{order_id}",
    )


async def _customer(conn: Any, order_id: int) -> str:
    if hasattr(conn, "fetchval"):  # asyncpg
        await conn.execute("UPDATE orders SET status = 'completed' WHERE order_id = $1", order_id)
        customer: str = await conn.fetchval(
            "SELECT customer FROM orders WHERE order_id = $1", order_id
        )
        return customer
    await conn.execute(
        text("UPDATE orders SET status = 'completed' WHERE order_id = :id"), {"id": order_id}
    )
    result = await conn.execute(
        text("SELECT customer FROM orders WHERE order_id = :id"), {"id": order_id}
    )
    return str(result.scalar_one())


def complete_order_sync(conn: Any, order_id: int) -> None:
    """The same for a synchronous psycopg connection, in its open transaction."""
    with conn.cursor() as cursor:
        cursor.execute("UPDATE orders SET status = 'completed' WHERE order_id = %s", (order_id,))
        cursor.execute("SELECT customer FROM orders WHERE order_id = %s", (order_id,))
        (customer,) = cursor.fetchone()
    outbox.sync.enqueue(
        conn,
        "OrderCompleted",
        {"orderId": order_id, "customer": customer},
        ordering_key=f"order-{order_id}",
    )
