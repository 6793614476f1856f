"""What the relay asks of its store: every call the relay's parts make, and nothing else, with
the values those calls take and give (so a store and the relay share no driver's module).

Two stores keep this contract: ``PostgresStore`` (``outbox.store.postgres``: the named statements
of ``queries.sql`` over a pool, what every host runs) and ``MemoryStore`` (``outbox.store.memory``:
the same rules over dicts, for the unit tests of the relay's loop). tests/contract runs the same
assertions against both. The operators' commands (``outbox.operations``: status, requeue, purge)
and migrations are not part of it: they speak to PostgreSQL only.

A call returns an awaitable: ``PostgresStore`` hands back the statement's own coroutine (no frame
of its own per call on the relay's path), ``MemoryStore`` answers in an ``async def``. Database
failures are raised as ``outbox.core.errors.DatabaseError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable
from uuid import UUID

from outbox.core.models import LeasedMessage, Recorded
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES

Key = tuple[str, str]  # an endpoint: (event type, endpoint name)


class BreakerSeen(NamedTuple):
    """What a relay's lease tells it of an endpoint whose breaker counts failures or is open."""

    event_type: str
    endpoint: str
    failures: int
    reopen_in: float | None  # seconds until it reopens (negative: it may be probed; None: closed)
    probing: bool
    paused: bool = False  # paused by an operator: its deliveries wait until it is resumed


class Lease(NamedTuple):
    """What one lease statement did: the messages it leased (at most the batch size), and how
    many due rows it parked behind their ordering key (those take none of the batch, and may be
    many more). When together they reach the batch size, more may be due."""

    messages: list[LeasedMessage]
    parked: int = 0
    # The database's clock when it leased them (seconds since the epoch), if it leased any.
    database_now: float | None = None
    # Endpoints whose breaker counts failures or is open (read with the lease).
    troubled: list[BreakerSeen] | None = None

    @property
    def taken(self) -> int:
        return len(self.messages) + self.parked


class Written(NamedTuple):
    """What an outcome write applied: the ids still held by our lease, and whether one of them
    let the next message of its ordering key go, due now."""

    applied: set[UUID]
    lets_next_go: bool = False


class SentAttempt(NamedTuple):
    """One attempt of ``record_delivered``: an endpoint that answered 2xx. Element i of its
    i-th attempt array, in this order."""

    outbox_message_id: UUID
    endpoint: str
    attempt_number: int
    started_epoch: float
    duration_ms: int
    http_status: int


class LearnedLimit(NamedTuple):
    """What another relay keeps of an endpoint's limit of requests in flight
    (``outbox_endpoint_limits``: one row per endpoint and relay process)."""

    event_type: str
    endpoint: str
    concurrency: float  # its limit (not yet ``learned``: what it started from)
    settled: float | None  # what its last push-back left of it
    age: float  # seconds since it was written, by the database's clock
    pushed_back_ago: float | None  # seconds since that push-back
    learned: bool  # False: written as the relay started, before any answer


class OwnLimit(NamedTuple):
    """This relay's limit of an endpoint, to keep (``RelayStore.save_limits``)."""

    event_type: str
    endpoint: str
    concurrency: float
    settled: float | None
    pushed_back_ago: float | None  # seconds before the write
    learned: bool


# Given what the other relays keep of the endpoints, what this relay starts from (and keeps).
StartFrom = Callable[[Sequence[LearnedLimit]], Sequence[OwnLimit]]


@runtime_checkable
class RelayStore(Protocol):
    """The store calls of the relay (lease, record, breakers, wake-ups), as
    ``store.postgres.PostgresStore`` documents them."""

    def lease_batch(
        self,
        batch_size: int,
        lease_seconds: float,
        *,
        hold_on_failure: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        usual_size: int | None = None,
        skip: Sequence[str] = (),
    ) -> Awaitable[Lease]:
        """Claim up to ``batch_size`` due messages for ``lease_seconds`` (one in flight per
        ordering key; those waiting behind one not in flight are parked)."""
        ...

    def endpoints_tried(
        self, message_ids: Sequence[UUID]
    ) -> Awaitable[dict[UUID, frozenset[str | None]]]:
        """The endpoints each message was sent to, by its attempt history."""
        ...

    def record_outcomes(
        self, records: Sequence[Recorded], *, hold_on_failure: bool = True, retrying: bool = False
    ) -> Awaitable[Written]:
        """Write a batch's outcomes and attempts, fenced by each message's lease token."""
        ...

    def record_delivered(
        self,
        messages: Sequence[LeasedMessage],
        attempts: Sequence[SentAttempt],
        *,
        hold_on_failure: bool = True,
        retrying: bool = False,
    ) -> Awaitable[Written]:
        """``record_outcomes`` for a batch whose every message was delivered."""
        ...

    def release_held(self, *, hold_on_failure: bool = True) -> Awaitable[int]:
        """Make due again the parked messages nothing is in the way of any more; how many."""
        ...

    def next_due_in(self) -> Awaitable[float | None]:
        """Seconds until the next Pending message comes due, if one waits for a time."""
        ...

    def notify_wakeup(self) -> Awaitable[bool]:
        """One wake-up to every listening relay (OUTBOX_WAKEUP=postgres): whether it was sent.
        Never raises: a lost wake-up is a warning, the row is safe."""
        ...

    def endpoint_failed(
        self,
        key: Key,
        failures: int,
        *,
        threshold: int,
        probe_failed: bool,
        cool_down: tuple[float, float],
        others: Sequence[str],
    ) -> Awaitable[float | None]:
        """Count an endpoint's failures, opening its breaker at ``threshold`` (or after a failed
        probe); the seconds until it reopens, if open."""
        ...

    def endpoint_recovered(self, key: Key) -> Awaitable[None]:
        """The endpoint answered: its breaker closes."""
        ...

    def claim_probe(self, key: Key, seconds: float) -> Awaitable[bool]:
        """Whether this relay sends the probe of the endpoint (claimed for ``seconds``)."""
        ...

    def paused_keys(self) -> Awaitable[frozenset[Key]]:
        """The endpoints an operator paused, read now (a run asks while it delivers)."""
        ...

    def start_limits(
        self, relay: UUID, keys: Sequence[Key], start: StartFrom, *, live_seconds: float
    ) -> Awaitable[Sequence[OwnLimit]]:
        """What the other relays keep of ``keys``' limits, handed to ``start``, whose answer is
        kept as relay ``relay``'s and returned; one relay at a time (another that starts
        meanwhile reads this one's). Rows no relay will read are forgotten first: those written
        more than ``live_seconds`` ago but their endpoint's latest learned one, and any older
        than a week."""
        ...

    def save_limits(self, relay: UUID, limits: Sequence[OwnLimit]) -> Awaitable[None]:
        """Keep relay ``relay``'s ``limits`` (its row of each endpoint, written over)."""
        ...
