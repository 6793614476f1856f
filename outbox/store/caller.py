"""The statements that run in the caller's own transaction: a producer's insert and wake-up, a
consumer's claim of a webhook id.

They are not run here: each is handed out as a ``Statement`` (its name in ``queries.sql`` and its
arguments) for the caller's driver (``outbox.producer.drivers``), so their driver errors are the
caller's own. Imports no driver.

Fast path (docs/performance.md, "The fast paths"): ``insert_message(generated_id=True)`` runs
no ``ON CONFLICT`` for an id just generated; docs/performance.md#an-insert-without-on-conflict
"""

from __future__ import annotations

from typing import Any, NamedTuple
from uuid import UUID

from outbox.store.sql import QUERIES


class Statement(NamedTuple):
    """A named statement and its arguments, for a driver of the caller's to run in the caller's
    transaction. ``sql`` has asyncpg's ``$1…$n`` placeholders; ``outbox.producer.drivers`` rewrites
    them for the driver's own style."""

    name: str
    args: tuple[Any, ...]

    @property
    def sql(self) -> str:
        return QUERIES[self.name]


def insert_message(
    message_id: UUID,
    event_type: str,
    payload: str,
    ordering_key: str | None = None,
    trace_context: str | None = None,
    *,
    generated_id: bool = False,
) -> Statement:
    """Insert a Pending row; it returns a row, or none when a row with this id already exists.
    ``trace_context``: the producer's W3C trace context as JSON text (``telemetry.capture()``).
    ``generated_id``: the id is a random UUID just made, so no conflict is looked for."""
    name = "insert_new_message" if generated_id else "insert_message"
    return Statement(name, (message_id, event_type, payload, ordering_key, trace_context))


def wakeup_statement() -> Statement:
    """The wake-up NOTIFY (OUTBOX_WAKEUP=postgres), for a producer's driver to send after its
    commit; it returns a row."""
    return Statement("notify_wakeup", ())


def enqueued_messages(event_type: str | None = None) -> Statement:
    """The messages as the caller's transaction sees them, oldest first (``outbox.testing``)."""
    return Statement("enqueued_messages", (event_type,))


def claim_inbox(webhook_id: str) -> Statement:
    """Record a received webhook id; it returns a row the first time, none once it is recorded."""
    return Statement("claim_inbox", (webhook_id,))
