"""Transactional outbox relay: rows written with your business data, delivered as webhooks."""

from outbox.errors import (
    ConfigurationError,
    DuplicateMessageError,
    InvalidMessageError,
    OutboxError,
    TransactionRequiredError,
)
from outbox.models import DrainSummary, Status
from outbox.processor import OutboxProcessor
from outbox.producer import enqueue, notify, transaction
from outbox.settings import QueueSettings, Settings
from outbox.wakeup import WakeUpQueue

__all__ = [
    "ConfigurationError",
    "DrainSummary",
    "DuplicateMessageError",
    "InvalidMessageError",
    "OutboxError",
    "OutboxProcessor",
    "QueueSettings",
    "Settings",
    "Status",
    "TransactionRequiredError",
    "WakeUpQueue",
    "enqueue",
    "notify",
    "transaction",
]
