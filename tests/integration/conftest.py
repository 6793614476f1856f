"""Fixtures for tests that use a caller's connection of every kind (tests/support/drivers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from outbox.store.migrate import migrate_inbox
from tests.support.drivers import KINDS, Harness

Connect = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def connect(database_url: str) -> AsyncIterator[Connect]:
    """Opens a harness of a kind on this test's database; all are closed afterwards."""
    opened: list[Harness] = []

    async def make(kind: str, *, autocommit: bool = False) -> Harness:
        harness = await KINDS[kind](database_url, autocommit)
        opened.append(harness)
        return harness

    yield make
    for harness in reversed(opened):
        await harness.close()


@pytest.fixture
async def orders(db: Any) -> Any:
    """A business table of the caller's, beside the outbox."""
    await db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL)")
    return db


@pytest.fixture
async def inbox(db: Any) -> Any:
    """The consumer inbox (``migrate --inbox``) in this test's database, and a business table."""
    await migrate_inbox(db)
    await db.execute("CREATE TABLE shipments (order_id int NOT NULL, webhook_id text NOT NULL)")
    return db
