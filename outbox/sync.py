"""``outbox.sync``: the producer for synchronous code at its documented path
(``outbox.producer.sync``); its ``WakeUpQueue`` (the Azure Storage SDK's client) loaded on first
use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outbox.producer import sync as _sync
from outbox.producer.sync import OutboxTransaction, claim, enqueue, notify, transaction

if TYPE_CHECKING:
    from outbox.producer.sync import WakeUpQueue

__all__ = ["OutboxTransaction", "WakeUpQueue", "claim", "enqueue", "notify", "transaction"]

# Hidden from type checkers, which see the import above.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        return getattr(_sync, name)
