"""The producer API and the inbox's claim for synchronous code (Flask, Django-style views,
workers): the rules of ``outbox.enqueue``, ``outbox.transaction``, ``outbox.notify`` and
``outbox.inbox.claim``, without an event loop.

::

    with session.begin():                              # a SQLAlchemy Session (or a psycopg one)
        session.add(order)
        outbox.sync.enqueue(session, "OrderCompleted", {"orderId": order.id})
    outbox.sync.notify(queue)                          # after the commit; never raises

``conn`` is a ``psycopg.Connection``, or a SQLAlchemy ``Session`` or ``Connection`` (psycopg or
psycopg2 driver); ``outbox.drivers`` says when each counts as inside a transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from outbox import store
from outbox.core.errors import DuplicateMessageError, TransactionRequiredError, describe
from outbox.producer import drivers
from outbox.producer.core import (
    NEEDS_CONNECTION,
    NOT_SENT,
    Payload,
    logger,
    nested_transaction,
    outside_transaction,
    over_postgres,
    prepare,
)

if TYPE_CHECKING:
    from outbox.transport.sync_wakeup import WakeUpQueue

__all__ = ["OutboxTransaction", "WakeUpQueue", "claim", "enqueue", "notify", "transaction"]


def enqueue(
    conn: object,
    event_type: str,
    payload: Payload,
    *,
    message_id: uuid.UUID | None = None,
    ordering_key: str | None = None,
    max_payload_bytes: int | None = None,
) -> uuid.UUID:
    """``outbox.enqueue`` for a synchronous connection or session: the same checks before
    anything is written, the same row, the same errors."""
    driver = drivers.sync_driver(conn, "enqueue")
    message_id, statement = prepare(
        event_type, payload, message_id, ordering_key, max_payload_bytes
    )
    if driver.autocommits():
        raise TransactionRequiredError(outside_transaction("enqueue", driver.begin_hint))
    with drivers.outdated_schema_errors():
        inserted = driver.returns_row(statement)
    if not inserted:
        raise DuplicateMessageError(f"outbox message {message_id} already exists")
    return message_id


def notify(queue: WakeUpQueue | None = None, *, conn: object | None = None) -> bool:
    """Send the wake-up hint after the commit. Never raises; returns whether it was sent, within
    five seconds at most.

    Pass a long-lived ``outbox.sync.WakeUpQueue`` to reuse its connection; without one, a client
    is made from the environment (``AzureWebJobsStorage``, ``OUTBOX_QUEUE_NAME``) for this hint.
    With ``OUTBOX_WAKEUP=postgres`` the hint is a NOTIFY sent on ``conn`` (the connection or
    session that committed) in a transaction of its own.
    """
    if queue is not None:
        return queue.notify()
    if not over_postgres():
        from outbox.transport.sync_wakeup import notify_once  # noqa: PLC0415 - see __getattr__

        return notify_once()
    if conn is None:
        logger.warning(NEEDS_CONNECTION)
        return False
    try:
        driver = drivers.sync_driver(conn, "notify")
        with driver.transaction():
            driver.returns_row(store.wakeup_statement())
    except Exception as exc:  # noqa: BLE001 - a hint must never fail the caller
        logger.warning(NOT_SENT, describe(exc))
        return False
    return True


def claim(conn: object, webhook_id: str) -> bool:
    """``outbox.inbox.claim`` for a synchronous connection or session: True the first time,
    False once the id is recorded by a committed transaction."""
    from outbox.producer.inbox import check_webhook_id  # noqa: PLC0415 - the consumer's module

    driver = drivers.sync_driver(conn, "claim")
    check_webhook_id(webhook_id)
    if driver.autocommits():
        raise TransactionRequiredError(outside_transaction("claim", driver.begin_hint))
    return driver.returns_row(store.claim_inbox(webhook_id))


class OutboxTransaction:
    """Handed out by ``transaction()``: enqueues on the transaction's connection."""

    def __init__(self, conn: object, max_payload_bytes: int | None) -> None:
        self._conn = conn
        self._max_payload_bytes = max_payload_bytes
        self.message_ids: list[uuid.UUID] = []

    def enqueue(
        self,
        event_type: str,
        payload: Payload,
        *,
        message_id: uuid.UUID | None = None,
        ordering_key: str | None = None,
    ) -> uuid.UUID:
        message_id = enqueue(
            self._conn,
            event_type,
            payload,
            message_id=message_id,
            ordering_key=ordering_key,
            max_payload_bytes=self._max_payload_bytes,
        )
        self.message_ids.append(message_id)
        return message_id


@contextmanager
def transaction(
    conn: object, queue: WakeUpQueue | None = None, *, max_payload_bytes: int | None = None
) -> Iterator[OutboxTransaction]:
    """Open a transaction on ``conn`` (``conn.transaction()``, ``session.begin()``); after it
    commits, send one hint if anything was enqueued. Inside a transaction already open it raises
    TransactionRequiredError: nested, it would commit nothing, and its hint would beat the commit.
    """
    driver = drivers.sync_driver(conn, "transaction")
    if driver.in_transaction():
        raise TransactionRequiredError(nested_transaction("outbox.sync"))
    tx = OutboxTransaction(conn, max_payload_bytes)
    with driver.transaction():
        yield tx
    if tx.message_ids:
        notify(queue, conn=conn)


# Hidden from type checkers, which see the import above.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """``WakeUpQueue``, loaded on first use: the Azure Storage SDK (and aiohttp under it) is
        no part of a synchronous producer's import, nor is the consumer's inbox."""
        if name == "WakeUpQueue":
            from outbox.transport.sync_wakeup import WakeUpQueue  # noqa: PLC0415

            return WakeUpQueue
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
