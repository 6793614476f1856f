"""Transactional outbox relay: rows written with your business data, delivered as webhooks.

``outbox.enqueue`` / ``transaction`` / ``notify`` for async code, ``outbox.sync`` for synchronous
code, ``outbox.inbox`` for the receiving service (signature check and duplicate detection).

Each export but the errors is loaded on first use (PEP 562): a producer's ``import outbox`` and
``outbox.enqueue`` load the producer, not the relay, aiohttp or the Azure SDK, since a producer's
import time is its service's (or Functions app's) cold start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from outbox.core.errors import (
    ConfigurationError,
    DuplicateMessageError,
    InvalidMessageError,
    OutboxError,
    OutdatedSchemaError,
    TransactionRequiredError,
)

if TYPE_CHECKING:
    from outbox import inbox, sync
    from outbox.core.models import DrainSummary, Status
    from outbox.core.settings import QueueSettings, Settings
    from outbox.producer import enqueue, notify, transaction
    from outbox.relay.processor import OutboxProcessor
    from outbox.transport.wakeup import WakeUpQueue

# The exports loaded on first use, and the module that holds each (the module itself for
# ``inbox`` and ``sync``).
_LAZY = {
    "DrainSummary": "outbox.core.models",
    "Status": "outbox.core.models",
    "QueueSettings": "outbox.core.settings",
    "Settings": "outbox.core.settings",
    "enqueue": "outbox.producer",
    "notify": "outbox.producer",
    "transaction": "outbox.producer",
    "OutboxProcessor": "outbox.relay.processor",
    "WakeUpQueue": "outbox.transport.wakeup",
    "inbox": "outbox.inbox",
    "sync": "outbox.sync",
}

__all__ = [
    "ConfigurationError",
    "DrainSummary",
    "DuplicateMessageError",
    "InvalidMessageError",
    "OutboxError",
    "OutboxProcessor",
    "OutdatedSchemaError",
    "QueueSettings",
    "Settings",
    "Status",
    "TransactionRequiredError",
    "WakeUpQueue",
    "enqueue",
    "inbox",
    "notify",
    "sync",
    "transaction",
]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# Hidden from type checkers, which see the imports above: a misspelt name stays an error there.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        home = _LAZY.get(name)
        if home is None:
            raise AttributeError(f"module 'outbox' has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"outbox.{name}" else getattr(module, name)
        globals()[name] = value  # once: later reads find it without this function
        return value
