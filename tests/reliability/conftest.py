"""Fixtures for the reliability suite: real processes, real sockets, faults injected on purpose."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import SECRET
from tests.support.receiver import Receiver


@pytest.fixture
def webhooks(receiver: Receiver) -> dict[str, Any]:
    """``OUTBOX_WEBHOOKS`` pointing at this test's receiver, signed with the documented secret."""
    return {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
