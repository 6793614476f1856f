"""Typed values that cross module boundaries: leased rows, delivery results, outcomes, summaries."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID


class Status(enum.StrEnum):
    """The four states of an outbox row; the strings are stored in ``outbox_messages.status``."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    FAILED = "Failed"


class LeasedMessage(NamedTuple):
    """A row this worker holds under a lease, as returned by the lease statement.

    A named tuple (immutable, and the cheapest value to make: one per leased row) whose fields
    are the lease statement's first columns, in order."""

    message_id: UUID
    event_type: str
    # The jsonb value as JSON text, spliced into the webhook body unchanged; None when it is
    # larger than the lease was asked to return (it will not be sent anyway).
    payload: str | None
    payload_bytes: int
    attempt: int  # attempt_count after the lease: 1 on the first delivery
    lease_token: UUID
    created_at: datetime
    ordering_key: str | None = None
    # Where each endpoint stands, kept only while they differ (None: as the row says).
    endpoint_state: Mapping[str, EndpointState] | None = None
    # The producer's W3C trace context as JSON text, if it had an active span at enqueue; one
    # over telemetry.MAX_TRACE_CONTEXT_CHARS is not fetched: {"outbox_oversize_chars": <length>}.
    trace_context: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LeasedMessage:
        """The message of a row of the lease statement (its columns in the fields' order; the
        endpoint state as JSON text)."""
        message = cls._make(row[:_FIELDS])
        if message.endpoint_state is None:
            return message
        return message._replace(endpoint_state=EndpointState.parse_map(row[_ENDPOINT_STATE]))


_FIELDS = len(LeasedMessage._fields)
_ENDPOINT_STATE = LeasedMessage._fields.index("endpoint_state")


@dataclass(frozen=True, slots=True)
class EndpointState:
    """Where one endpoint of a message stands: its status, attempts and last error."""

    status: Status  # Pending, Processed or Failed
    attempts: int = 0
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"status": str(self.status), "attempts": self.attempts}
        if self.error is not None:
            shown["error"] = self.error
        return shown

    @classmethod
    def parse_map(cls, text: str) -> dict[str, EndpointState]:
        """The ``endpoint_state`` column's JSON text, endpoint by endpoint."""
        return {
            name: cls(Status(state["status"]), int(state.get("attempts", 0)), state.get("error"))
            for name, state in json.loads(text).items()
        }


@dataclass(frozen=True, slots=True)
class Response:
    """The receiver answered with an HTTP status."""

    status: int
    retry_after: str | None = None
    snippet: str = ""


@dataclass(frozen=True, slots=True)
class TransportError:
    """No usable HTTP answer: refused, reset, timed out, or not HTTP at all."""

    description: str
    error_class: str = "TransportError"  # the exception's class name, for the attempt history


@dataclass(frozen=True, slots=True)
class Undeliverable:
    """The message cannot be sent as it is: no endpoint for its type, or a payload we refuse."""

    reason: str


@dataclass(frozen=True, slots=True)
class NotAttempted:
    """The delivery never started (lease too short to finish, the run stopped, the endpoint's
    breaker open); due again in ``retry_in`` seconds, the attempt not counted."""

    reason: str
    retry_in: float = 0.0


DeliveryResult = Response | TransportError | Undeliverable | NotAttempted


class Attempt(NamedTuple):
    """One delivery attempt as the worker saw it: the result and when it ran (worker clock).
    A named tuple: one is made per delivery."""

    result: DeliveryResult
    started_epoch: float  # seconds since the epoch
    duration_ms: int
    # The (trace id, span id) of its span, in hex, for its log line; None without one.
    trace: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write back for one message."""

    status: Status
    delay_seconds: float = 0.0  # Pending only: due again this long after the database's now()
    error: str | None = None
    not_attempted: bool = False  # released without a delivery: the attempt is not counted


@dataclass(frozen=True, slots=True)
class Delivered:
    """One endpoint's part of a message's outcome: its attempt and what it came to."""

    endpoint: str | None  # None: no endpoint was configured for the event type
    number: int  # the endpoint's attempt number: 1 on its first delivery
    attempt: Attempt
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``record_outcomes`` writes for one leased message: the message's outcome (its
    endpoints' together), each endpoint's, and where they stand when they differ."""

    message: LeasedMessage
    outcome: Outcome
    deliveries: tuple[Delivered, ...]
    endpoint_state: Mapping[str, EndpointState] | None = None


@dataclass(slots=True)
class DrainSummary:
    """What one ``execute()`` did.

    ``released``: leased but not attempted (given back, attempt not counted); ``stale``: outcomes
    dropped by fencing because the lease had passed to another worker; ``unrecorded``: outcomes
    lost to a database error (those rows are delivered again after their lease expires).
    """

    leased: int = 0
    processed: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    stale: int = 0
    unrecorded: int = 0
    batches: int = 0
    duration_seconds: float = 0.0
    stopped_by: str = "drained"
    error: str | None = field(default=None)

    def count(self, outcome: Outcome) -> None:
        if outcome.not_attempted:
            self.released += 1
        elif outcome.status is Status.PROCESSED:
            self.processed += 1
        elif outcome.status is Status.FAILED:
            self.failed += 1
        else:
            self.retried += 1

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["duration_seconds"] = round(self.duration_seconds, 3)
        return data
