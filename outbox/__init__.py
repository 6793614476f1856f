"""Transactional outbox relay: rows written with your business data, delivered as webhooks.

``outbox.enqueue`` / ``transaction`` / ``notify`` for async code, ``outbox.sync`` for synchronous
code, ``outbox.inbox`` for the receiving service (signature check and duplicate detection).
"""

from outbox import inbox, sync
from outbox.core.errors import (
    ConfigurationError,
    DuplicateMessageError,
    InvalidMessageError,
    OutboxError,
    OutdatedSchemaError,
    TransactionRequiredError,
)
from outbox.core.models import DrainSummary, Status
from outbox.core.settings import QueueSettings, Settings
from outbox.producer import enqueue, notify, transaction
from outbox.relay.processor import OutboxProcessor
from outbox.transport.wakeup import WakeUpQueue

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
