"""The relay's store in memory (``RelayStore``): the rules of ``queries.sql`` over dicts.

For the unit tests of the relay's loop (its end conditions, stop rules, breakers, admission):
a processor built over a ``MemoryStore`` runs without PostgreSQL, in milliseconds, on a clock
the test moves (``clock``: seconds since the epoch, ``time.time`` by default). tests/contract
runs the same assertions against this store and PostgreSQL.

What it keeps, as the SQL does: Pending, Processing, Processed and Failed messages; leases with
an expiry and a fresh token each (a write whose token is not the row's any more is stale, its
attempts kept as not applied); one message in flight per ordering key, a later one parked
(``next_attempt_at`` infinite) behind an earlier one not in flight, a Failed one holding its key
under ``hold_on_failure``, a finished one letting the next go; retries due after their delay;
the endpoints' breakers (failures counted, opened at the threshold or by a failed probe, the
cool-down doubling per opening, one probe claimed, closed by an answer) and the due messages of
an open endpoint pushed to its reopening; the endpoint state kept per message.

What it simplifies: one lease at a time (the event loop's, no locks, nothing ``SKIP LOCKED``
over); a lease reads every due message in due order (no 10,000-row bounds, no separate scans
for free rows and keys' heads), parking what it meets until its batch is full; a write is
never lost, so ``retrying`` finds what it wrote; no payload size on disk (the text's UTF-8
length), no trace context oversize check, no database errors unless a test sets ``failing``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID

from outbox.core.errors import DatabaseError
from outbox.core.ids import new_message_id
from outbox.core.models import LeasedMessage, Recorded
from outbox.core.outcomes import attempt_facts
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.store.contract import (
    BreakerSeen,
    Key,
    Lease,
    OwnLimit,
    RelayStore,
    SentAttempt,
    StartFrom,
    Written,
)
from outbox.store.memory_rows import (
    FAILED,
    PENDING,
    PROCESSED,
    PROCESSING,
    AttemptEntry,
    Endpoint,
    LimitRow,
    Row,
    apply_record,
    due_at,
    endpoint_status,
    forget_limits,
    in_way,
    keep_limits,
    learned_limits,
)


@dataclass(eq=False)
class MemoryStore:
    """The relay's store in memory; ``add`` puts a message in, the fields are there to read."""

    clock: Callable[[], float] = time.time
    messages: dict[UUID, Row] = field(default_factory=dict)
    attempts: list[AttemptEntry] = field(default_factory=list)
    endpoints: dict[Key, Endpoint] = field(default_factory=dict)
    # Set by a test: every call raises this (a database that went away).
    failing: DatabaseError | None = None
    # Each call's name, in order (what the relay asked).
    calls: list[str] = field(default_factory=list)
    # Wake-ups sent (notify_wakeup): the NOTIFYs a listening relay would have heard.
    wakeups_sent: int = 0
    # Endpoints an operator paused (outbox_paused_endpoints).
    paused: set[Key] = field(default_factory=set)
    # Each relay's learned limit of each endpoint (outbox_endpoint_limits), by (key, relay).
    limits: dict[tuple[Key, UUID], LimitRow] = field(default_factory=dict)
    _seq: int = field(default=0, init=False, repr=False)  # the ordering sequence

    def add(
        self,
        event_type: str,
        payload: str = "{}",
        *,
        ordering_key: str | None = None,
        message_id: UUID | None = None,
    ) -> UUID:
        """Insert a Pending message, due now (``insert_message``)."""
        message_id = message_id or new_message_id()
        seq = None
        if ordering_key is not None:
            self._seq += 1
            seq = self._seq
        now = self.clock()
        self.messages[message_id] = Row(
            message_id, event_type, payload, now, ordering_key, seq, next_attempt_at=now
        )
        return message_id

    def _call(self, name: str) -> float:
        self.calls.append(name)
        if self.failing is not None:
            raise self.failing
        return self.clock()

    # The lease.

    async def lease_batch(
        self,
        batch_size: int,
        lease_seconds: float,
        *,
        hold_on_failure: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        usual_size: int | None = None,
        skip: Sequence[str] = (),
    ) -> Lease:
        now = self._call("lease_batch")
        due = sorted(
            (
                r
                for r in self.messages.values()
                if due_at(r) <= now and r.status in (PENDING, PROCESSING)
                if r.event_type not in skip
            ),
            key=lambda r: (due_at(r), r.created_at),
        )
        leased: list[LeasedMessage] = []
        parked = 0
        for row in due:
            if len(leased) >= batch_size:
                break
            before = self._before(row, hold_on_failure)
            if before is not None:
                if before.status != PROCESSING:  # waits for one not in flight: parked
                    row.next_attempt_at = math.inf
                    parked += 1
                continue
            leased.append(self._lease(row, now, lease_seconds, max_payload_bytes))
        if not leased and not parked:
            return Lease([])
        return Lease(leased, parked, now, self._troubled(now))

    def _lease(self, row: Row, now: float, seconds: float, max_bytes: int) -> LeasedMessage:
        row.status = PROCESSING
        row.attempt_count += 1
        row.lease_expires_at = row.next_attempt_at = now + seconds
        row.lease_token = uuid.uuid4()
        size = len(row.payload.encode())
        return LeasedMessage.from_row(
            (
                row.message_id,
                row.event_type,
                row.payload if size <= max_bytes else None,
                size,
                row.attempt_count,
                row.lease_token,
                datetime.fromtimestamp(row.created_at, UTC),
                row.ordering_key,
                row.endpoint_state,
                row.trace_context,
            )
        )

    def _before(self, row: Row, hold: bool) -> Row | None:
        """The nearest earlier message of ``row``'s key still in its way, if any."""
        if row.ordering_key is None:
            return None
        assert row.ordering_seq is not None
        earlier = [
            e
            for e in self._key(row.ordering_key)
            if e.ordering_seq is not None and e.ordering_seq < row.ordering_seq
        ]
        blocking = [e for e in earlier if in_way(e, hold)]
        return blocking[-1] if blocking else None

    def _key(self, key: str) -> list[Row]:
        rows = [r for r in self.messages.values() if r.ordering_key == key]
        return sorted(rows, key=lambda r: r.ordering_seq or 0)

    def _troubled(self, now: float) -> list[BreakerSeen]:
        counted = [
            BreakerSeen(
                *key,
                e.failures,
                None if e.reopen_at is None else e.reopen_at - now,
                e.probe_until is not None and e.probe_until > now,
                key in self.paused,
            )
            for key, e in self.endpoints.items()
            if e.failures > 0 or e.reopen_at is not None
        ]
        only_paused = [
            BreakerSeen(*key, 0, None, False, True) for key in self.paused - set(self.endpoints)
        ]
        return counted + only_paused

    async def endpoints_tried(
        self, message_ids: Sequence[UUID]
    ) -> dict[UUID, frozenset[str | None]]:
        self._call("endpoints_tried")
        tried: dict[UUID, set[str | None]] = {}
        for entry in self.attempts:
            if entry.message_id in message_ids:
                tried.setdefault(entry.message_id, set()).add(entry.endpoint)
        return {m: frozenset(names) for m, names in tried.items()}

    # The outcome writes.

    async def record_outcomes(
        self, records: Sequence[Recorded], *, hold_on_failure: bool = True, retrying: bool = False
    ) -> Written:
        now = self._call("record_outcomes")
        if not records:
            return Written(set())
        if retrying and (earlier := self._written_before([r.message for r in records])):
            return earlier
        applied: set[UUID] = set()
        lets_next_go = False
        for record in records:
            row = self._held(record.message)
            if row is not None:
                applied.add(row.message_id)
                apply_record(row, record, now)
                lets_next_go |= self._let_next_go(row, now, hold_on_failure)
            if row is not None or record.message.message_id in self.messages:
                self._keep_history(record, applied=row is not None)  # none without its message
        return Written(applied, lets_next_go)

    def _keep_history(self, record: Recorded, *, applied: bool) -> None:
        message = record.message
        for delivered in record.deliveries:
            if delivered.outcome.not_attempted:
                continue  # given back: no attempt to keep
            self.attempts.append(
                AttemptEntry(
                    message.message_id,
                    delivered.endpoint,
                    delivered.number,
                    message.lease_token,
                    delivered.outcome.status.value,
                    applied,
                    attempt_facts(delivered.attempt.result).http_status,
                    delivered.outcome.error,
                )
            )

    async def record_delivered(
        self,
        messages: Sequence[LeasedMessage],
        attempts: Sequence[SentAttempt],
        *,
        hold_on_failure: bool = True,
        retrying: bool = False,
    ) -> Written:
        now = self._call("record_delivered")
        if not messages:
            return Written(set())
        if retrying and (earlier := self._written_before(messages)):
            return earlier
        applied: set[UUID] = set()
        lets_next_go = False
        tokens = {m.message_id: m.lease_token for m in messages}
        for message in messages:
            row = self._held(message)
            if row is None:
                continue
            applied.add(row.message_id)
            row.status, row.processed_at, row.lease_expires_at = PROCESSED, now, None
            row.last_error = row.endpoint_state = None
            lets_next_go |= self._let_next_go(row, now, hold_on_failure)
        for a in attempts:
            if a.outbox_message_id in applied or a.outbox_message_id in self.messages:
                self.attempts.append(
                    AttemptEntry(
                        a.outbox_message_id,
                        a.endpoint,
                        a.attempt_number,
                        tokens[a.outbox_message_id],
                        PROCESSED,
                        a.outbox_message_id in applied,
                        a.http_status,
                    )
                )
        return Written(applied, lets_next_go)

    def _held(self, message: LeasedMessage) -> Row | None:
        """The message's row, if the write's lease token still holds it."""
        row = self.messages.get(message.message_id)
        if row is None or row.status != PROCESSING or row.lease_token != message.lease_token:
            return None
        return row

    def _let_next_go(self, row: Row, now: float, hold: bool) -> bool:
        """A finished keyed message lets the next of its key go; whether that one is due now."""
        done = row.status == PROCESSED or (row.status == FAILED and not hold)
        if row.ordering_key is None or not done:
            return False
        after = [
            n
            for n in self._key(row.ordering_key)
            if (n.ordering_seq or 0) > (row.ordering_seq or 0) and in_way(n, hold)
        ]
        if not after or after[0].status != PENDING:
            return False
        following = after[0]
        due = following.next_attempt_at == math.inf or following.next_attempt_at <= now
        if following.next_attempt_at == math.inf:
            following.next_attempt_at = now
        return due

    def _written_before(self, messages: Sequence[LeasedMessage]) -> Written | None:
        applied = {
            m.message_id
            for m in messages
            if (row := self.messages.get(m.message_id)) is not None
            and row.lease_token == m.lease_token
            and row.status != PROCESSING
        }
        tokens = {(m.message_id, m.lease_token) for m in messages}
        written = any((a.message_id, a.lease_token) in tokens for a in self.attempts)
        return Written(applied, lets_next_go=True) if written or applied else None

    # Ordering keys and wake-ups.

    async def release_held(self, *, hold_on_failure: bool = True) -> int:
        now = self._call("release_held")
        released = 0
        for key in {r.ordering_key for r in self.messages.values() if r.ordering_key}:
            rows = self._key(key)
            parked = [r for r in rows if r.next_attempt_at == math.inf]
            if not parked:
                continue
            first = parked[0]
            if first.status == PENDING and self._before(first, hold_on_failure) is None:
                first.next_attempt_at = now
                released += 1
        return released

    async def notify_wakeup(self) -> bool:
        try:
            self._call("notify_wakeup")
        except DatabaseError:
            return False
        self.wakeups_sent += 1
        return True

    async def next_due_in(self) -> float | None:
        now = self._call("next_due_in")
        waits = [
            r.next_attempt_at - now
            for r in self.messages.values()
            if r.status == PENDING and now < r.next_attempt_at < math.inf
        ]
        return min(waits, default=None)

    # The breakers.

    async def endpoint_failed(
        self,
        key: Key,
        failures: int,
        *,
        threshold: int,
        probe_failed: bool,
        cool_down: tuple[float, float],
        others: Sequence[str],
    ) -> float | None:
        now = self._call("endpoint_failed")
        endpoint = self.endpoints.setdefault(key, Endpoint())
        endpoint.failures += failures
        trips = endpoint.failures >= threshold or probe_failed
        if trips and (endpoint.reopen_at is None or endpoint.reopen_at <= now):
            endpoint.reopen_at = now + min(cool_down[0] * 2**endpoint.opens, cool_down[1])
            endpoint.opens += 1
        if probe_failed:
            endpoint.probe_until = None
        reopen_at = endpoint.reopen_at
        if reopen_at is None or reopen_at <= now:
            return None
        for row in self.messages.values():
            if (
                row.event_type == key[0]
                and row.status == PENDING
                and row.next_attempt_at < reopen_at
                and not any(endpoint_status(row, other) == PENDING for other in others)
            ):
                row.next_attempt_at = reopen_at  # waits for nothing but this endpoint
        return reopen_at - now

    async def endpoint_recovered(self, key: Key) -> None:
        self._call("endpoint_recovered")
        self.endpoints.pop(key, None)

    async def paused_keys(self) -> frozenset[Key]:
        self._call("paused_keys")
        return frozenset(self.paused)

    async def claim_probe(self, key: Key, seconds: float) -> bool:
        now = self._call("claim_probe")
        endpoint = self.endpoints.get(key)
        if endpoint is None or endpoint.reopen_at is None or endpoint.reopen_at > now:
            return False
        if endpoint.probe_until is not None and endpoint.probe_until > now:
            return False
        endpoint.probe_until = now + seconds
        return True

    # The learned limits (the rules: memory_rows.py).

    async def start_limits(
        self, relay: UUID, keys: Sequence[Key], start: StartFrom, *, live_seconds: float
    ) -> Sequence[OwnLimit]:
        now = self._call("start_limits")
        forget_limits(self.limits, now, live_seconds)
        kept = start(learned_limits(self.limits, relay, keys, now))
        keep_limits(self.limits, relay, kept, now)
        return kept

    async def save_limits(self, relay: UUID, limits: Sequence[OwnLimit]) -> None:
        keep_limits(self.limits, relay, limits, self._call("save_limits"))


if TYPE_CHECKING:  # mypy checks that the memory store keeps the whole contract

    def _keeps_the_contract(store: MemoryStore) -> RelayStore:
        return store
