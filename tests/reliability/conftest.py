"""Fixtures for the reliability suite: real processes, real sockets, faults injected on purpose."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import SECRET
from tests.support.receiver import Receiver
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
def webhooks(receiver: Receiver) -> dict[str, Any]:
    """``OUTBOX_WEBHOOKS`` pointing at this test's receiver, signed with the documented secret."""
    return {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}


@pytest.fixture
async def proxy(database_url: str) -> AsyncIterator[TcpProxy]:
    """A TCP proxy in front of this test's database, that the test can cut."""
    parts = urlsplit(database_url)
    server = await TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    yield server
    await server.stop()
