"""Fixtures over real services: a PostgreSQL database per test and a local webhook receiver."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from outbox.azure.host import functions_host
from outbox.core.settings import QueueSettings, Settings
from tests.support import pg
from tests.support.azurite import Azurite
from tests.support.receiver import Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks documentation's example


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--outbox-layout",
        choices=("plain", "partitioned"),
        default="plain",
        help="the layout of the outbox tables every test database starts with",
    )


@pytest.fixture(scope="session")
def outbox_layout(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--outbox-layout"))


@pytest.fixture(scope="session", autouse=True)
def _clean_environment() -> Iterator[None]:
    """Tests set what they need; nothing leaks in from the shell that runs them."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("OUTBOX_", "AzureWebJobs"))}
    for key in saved:
        if key != "OUTBOX_TEST_ADMIN_DSN":
            del os.environ[key]
    yield
    os.environ.update(saved)


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    return pg.admin_dsn()


@pytest.fixture(scope="session")
def template_db(admin_dsn: str, outbox_layout: str) -> Iterator[str]:
    name = asyncio.run(pg.create_template(admin_dsn, outbox_layout))
    yield name
    asyncio.run(pg.drop(admin_dsn, name))


@pytest.fixture
async def database_url(admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test only."""
    name = await pg.create_copy(admin_dsn, template_db)
    yield pg.with_database(admin_dsn, name)
    await pg.drop(admin_dsn, name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = await Receiver().start()
    yield server
    await server.stop()


@pytest.fixture
def make_settings(database_url: str, receiver: Receiver) -> Any:
    """Settings for this test's database and receiver; keyword arguments override."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "webhooks": {
                "OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET},
                "Unsigned": {"url": receiver.url("/unsigned")},
            },
            "lease_seconds": 30,
            "http_timeout_seconds": 5,
        }
        values.update(overrides)
        return Settings.load(**values)

    return make


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """Azurite's queue service, shared by the session (each test uses its own queue)."""
    server = Azurite().start()
    yield server
    server.stop()


@pytest.fixture
def queue_settings(azurite: Azurite) -> QueueSettings:
    """A wake-up queue of this test's own on the shared Azurite."""
    return QueueSettings.load(
        queue_connection=azurite.connection_string,
        queue_name=f"wakeup-{uuid.uuid4().hex[:16]}",
    )


@pytest.fixture
async def app_env(
    monkeypatch: pytest.MonkeyPatch, database_url: str, receiver: Receiver
) -> AsyncIterator[None]:
    """App settings as the host would pass them, and a fresh per-process relay afterwards."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    monkeypatch.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps({"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}),
    )
    monkeypatch.setenv("OUTBOX_HTTP_TIMEOUT_SECONDS", "5")
    yield
    await functions_host.close()
