"""The outbox's fixtures (opt-in) and this service's table in each test database."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the service's modules

from orders import SCHEMA

pytest_plugins = ["outbox.pytest_plugin"]


@pytest.fixture
async def conn(outbox_database_url: str) -> AsyncIterator[Any]:
    connection = await asyncpg.connect(outbox_database_url)
    await connection.execute(SCHEMA)
    await connection.execute("INSERT INTO orders (order_id, customer) VALUES (42, 'Ada')")
    yield connection
    await connection.close()
