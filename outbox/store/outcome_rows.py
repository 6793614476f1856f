"""How the outcome writes bind a batch: one array per column, element i for message (or attempt) i.

Fast path (docs/performance.md, "The fast paths"): ``OutcomeRow``, ``AttemptRow`` and
``contract.SentAttempt`` are bound as one array per column rather than one JSON document;
docs/performance.md#outcomes-bound-as-arrays
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from outbox.core.models import Delivered, LeasedMessage, Recorded
from outbox.core.outcomes import attempt_facts


class OutcomeRow(NamedTuple):
    """One message of record_outcomes: element i of its i-th array parameter, in this order.

    Arrays rather than one JSON document: asyncpg encodes them without building a dict per
    record, and the database does not parse JSON (measured: about 4 µs of the relay's CPU and
    2 µs of the database's per message).
    """

    outbox_message_id: UUID
    lease_token: UUID
    status: str
    delay_seconds: float
    last_error: str | None
    not_attempted: bool
    endpoint_state: str | None  # JSON text, or None: the endpoints stand as the row says


class AttemptRow(NamedTuple):
    """One attempt (an endpoint's delivery) of record_outcomes, after the OutcomeRow arrays."""

    outbox_message_id: UUID
    endpoint: str | None
    attempt_number: int
    status: str
    started_epoch: float
    duration_ms: int
    http_status: int | None
    error_class: str | None
    error: str | None
    response_snippet: str | None


def outcome_row(record: Recorded) -> OutcomeRow:
    """The message's outcome, and the lease token that fences the write."""
    outcome, state = record.outcome, record.endpoint_state
    return OutcomeRow(
        outbox_message_id=record.message.message_id,
        lease_token=record.message.lease_token,
        status=outcome.status.value,
        delay_seconds=outcome.delay_seconds,
        last_error=outcome.error,
        not_attempted=outcome.not_attempted,
        endpoint_state=(
            None
            if state is None
            else json.dumps({name: s.as_json() for name, s in state.items()}, ensure_ascii=False)
        ),
    )


def attempted(delivered: Delivered) -> bool:
    return not delivered.outcome.not_attempted


def attempt_row(record: Recorded, delivered: Delivered) -> AttemptRow:
    """One attempt's history columns."""
    attempt, outcome = delivered.attempt, delivered.outcome
    facts = attempt_facts(attempt.result)
    return AttemptRow(
        outbox_message_id=record.message.message_id,
        endpoint=delivered.endpoint,
        attempt_number=delivered.number,
        status=outcome.status.value,
        started_epoch=attempt.started_epoch,
        duration_ms=attempt.duration_ms,
        http_status=facts.http_status,
        error_class=facts.error_class,
        error=outcome.error,
        response_snippet=facts.response_snippet,
    )


def created_range(messages: Sequence[LeasedMessage]) -> tuple[datetime, datetime]:
    """The earliest and latest created_at of ``messages``: on the partitioned layout the
    outcome writes read only the partitions between (docs/partitioning.md)."""
    created = [m.created_at for m in messages]
    return min(created), max(created)
