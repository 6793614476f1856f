"""The rows the memory store keeps (``outbox.store.memory``): its tables as dataclasses, and the
rules of ``queries.sql`` that read or write one row (an outcome applied, when a row is due,
whether it keeps its key's later messages waiting, an endpoint's state in it)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from outbox.core.models import Recorded, Status
from outbox.store.contract import Key, LearnedLimit, OwnLimit

PENDING, PROCESSING = Status.PENDING.value, Status.PROCESSING.value
PROCESSED, FAILED = Status.PROCESSED.value, Status.FAILED.value


@dataclass(eq=False)
class Row:
    """One message, as ``outbox_messages`` holds it (times in the store's clock's seconds)."""

    message_id: UUID
    event_type: str
    payload: str
    created_at: float
    ordering_key: str | None = None
    ordering_seq: int | None = None
    status: str = PENDING
    attempt_count: int = 0
    next_attempt_at: float = 0.0  # math.inf: parked behind an earlier message of its key
    lease_expires_at: float | None = None
    lease_token: UUID | None = None
    processed_at: float | None = None
    last_error: str | None = None
    endpoint_state: str | None = None  # JSON text, as the column returns it
    trace_context: str | None = None


@dataclass(frozen=True)
class AttemptEntry:
    """One row of ``outbox_attempts``."""

    message_id: UUID
    endpoint: str | None
    number: int
    lease_token: UUID
    outcome: str
    applied: bool
    http_status: int | None = None
    error: str | None = None


@dataclass
class Endpoint:
    """One row of ``outbox_endpoints``: an endpoint whose breaker counts or is open."""

    failures: int = 0
    opens: int = 0
    reopen_at: float | None = None
    probe_until: float | None = None


@dataclass
class LimitRow:
    """One row of ``outbox_endpoint_limits``: a relay's limit of an endpoint."""

    concurrency: float
    settled: float | None
    pushed_back_at: float | None
    learned: bool
    updated_at: float


# A row of any relay is forgotten after a week (``forget_limits``).
LIMIT_ROWS_KEPT_SECONDS = 7 * 24 * 3600.0


def apply_record(row: Row, record: Recorded, now: float) -> None:
    """A message's outcome on its row, as ``record_outcomes``' update sets it."""
    outcome, state = record.outcome, record.endpoint_state
    row.status = outcome.status.value
    if outcome.not_attempted:
        row.attempt_count -= 1
    else:
        row.last_error = outcome.error
    if outcome.status is Status.PENDING:
        row.next_attempt_at = now + outcome.delay_seconds
    row.processed_at = now if outcome.status is Status.PROCESSED else None
    row.lease_expires_at = None
    row.endpoint_state = (
        None
        if state is None
        else json.dumps({n: s.as_json() for n, s in state.items()}, ensure_ascii=False)
    )


def due_at(row: Row) -> float:
    """When a row is due: its next attempt while Pending, its lease's end while Processing."""
    if row.status == PROCESSING:
        return -math.inf if row.lease_expires_at is None else row.lease_expires_at
    return row.next_attempt_at


def in_way(row: Row, hold: bool) -> bool:
    """Whether an earlier message of a key keeps the later ones waiting."""
    return row.status != PROCESSED and (row.status != FAILED or hold)


def endpoint_status(row: Row, endpoint: str) -> str:
    """What the row's endpoint state says of ``endpoint``'s delivery (Pending where none)."""
    if row.endpoint_state is None:
        return PENDING
    state = json.loads(row.endpoint_state).get(endpoint)
    return PENDING if state is None else str(state.get("status", PENDING))


# ``outbox_endpoint_limits``' statements over ``limits`` (by endpoint and relay, as its key).
Limits = dict[tuple[Key, UUID], LimitRow]


def learned_limits(
    limits: Limits, relay: UUID, keys: Sequence[Key], now: float
) -> list[LearnedLimit]:
    """What the relays but ``relay`` keep of ``keys``' limits (``learned_limits``)."""
    wanted = set(keys)
    return [
        LearnedLimit(
            *key,
            row.concurrency,
            row.settled,
            now - row.updated_at,
            None if row.pushed_back_at is None else now - row.pushed_back_at,
            row.learned,
        )
        for (key, other), row in limits.items()
        if key in wanted and other != relay
    ]


def keep_limits(limits: Limits, relay: UUID, own: Sequence[OwnLimit], now: float) -> None:
    """Relay ``relay``'s rows written over (``save_limits``)."""
    for limit in own:
        pushed = None if limit.pushed_back_ago is None else now - limit.pushed_back_ago
        limits[((limit.event_type, limit.endpoint), relay)] = LimitRow(
            limit.concurrency, limit.settled, pushed, limit.learned, now
        )


def forget_limits(limits: Limits, now: float, live_seconds: float) -> None:
    """The rows no relay will read deleted (``forget_limits``)."""
    latest: dict[Key, float] = {}
    for (key, _), row in limits.items():
        if row.learned:
            latest[key] = max(latest.get(key, -math.inf), row.updated_at)
    for (key, relay), row in list(limits.items()):
        age = now - row.updated_at
        kept = row.learned and row.updated_at >= latest[key]
        if age > live_seconds and (age > LIMIT_ROWS_KEPT_SECONDS or not kept):
            del limits[(key, relay)]
