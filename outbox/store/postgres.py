"""``PostgresStore``: the relay's store (``contract.RelayStore``) over PostgreSQL.

Each call the relay makes is a method here that runs its named statement of ``queries.sql``
(the lease, the outcome writes, the breakers, the wake-up, the paused endpoints) inside the
driver-error boundary (``connection.database_boundary``): calling one hands back the boundary's
coroutine, so the relay's path awaits no frame of a forwarding layer.

Fast paths (docs/performance.md, "The fast paths"; the statements' own are indexed at the top of
``queries.sql``):

- ``lease_statement``: the usual batch size written into the lease, planned once per connection;
  docs/performance.md#the-leases-batch-size-in-its-sql
- ``record_delivered``: a batch all delivered, written from fewer arrays than ``record_outcomes``;
  docs/performance.md#the-lean-outcome-write
- the outcome writes bind one array per column (``outcome_rows``);
  docs/performance.md#outcomes-bound-as-arrays
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from uuid import UUID

import asyncpg

from outbox.core.models import LeasedMessage, Recorded
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.store.connection import TRANSIENT_ERRORS, Connection, database_boundary, transaction
from outbox.store.contract import (
    BreakerSeen,
    Key,
    LearnedLimit,
    Lease,
    OwnLimit,
    SentAttempt,
    StartFrom,
    Written,
)
from outbox.store.outcome_rows import (
    AttemptRow,
    attempt_row,
    attempted,
    created_range,
    outcome_row,
)
from outbox.store.sql import QUERIES

logger = logging.getLogger("outbox.store")

_LEASE_TOKEN = LeasedMessage._fields.index("lease_token")


@functools.lru_cache(maxsize=8)
def lease_statement(batch_size: int) -> str:
    """``lease_batch`` with its batch size written in (``LIMIT 100``) instead of bound as ``$4``.

    No parameter then changes its plan, so the server plans it once per connection and keeps the
    plan. With ``LIMIT $4`` it was planned again at every lease: a plan made for any limit
    guesses that a tenth of the due rows are wanted, which the plan cache judges dearer than a
    plan for the actual limit; that planning was about a twelfth of the server's CPU per message.
    """
    statement = QUERIES["lease_batch"]
    if "LIMIT $4" not in statement:
        raise ValueError("lease_batch no longer takes its batch size as LIMIT $4")
    statement = statement.replace("LIMIT $4", f"LIMIT {int(batch_size)}")
    # The batch size compared with a count ("was the due scan cut short?").
    return statement.replace("$4::bigint", f"{int(batch_size)}::bigint")


_DUE_ROWS = "    WHERE m.status IN ('Pending', 'Processing')\n"
_FREE_ROWS = "      AND m.ordering_key IS NULL\n"
_HEAD_ROWS = "                AND h.due_at <= now()\n"


@functools.cache
def lease_past_statement() -> str:
    """``lease_batch`` reading past the messages of the event types bound as ``$5`` (text[]):
    its ``due`` takes only the rows of the ``lease_past`` clause, at most 10,000 due rows read."""
    statement = QUERIES["lease_batch"]
    if statement.count("WITH due AS (") != 1 or statement.count(_DUE_ROWS) != 1:
        raise ValueError("lease_batch no longer has the shape lease_past is spliced into")
    statement = statement.replace("WITH due AS (", f"WITH {QUERIES['lease_past']}\ndue AS (")
    past = "      AND m.outbox_message_id = ANY (ARRAY(SELECT outbox_message_id FROM past))\n"
    statement = statement.replace(_DUE_ROWS, _DUE_ROWS + past)
    # The rows without a key taken beside parked ones ("free") and the first messages of other
    # keys ("heads") skip the same event types.
    if statement.count(_FREE_ROWS) != 1 or statement.count(_HEAD_ROWS) != 1:
        raise ValueError("lease_batch no longer has the shape lease_past is spliced into")
    statement = statement.replace(
        _FREE_ROWS, _FREE_ROWS + "      AND m.event_type <> ALL ($5::text[])\n"
    )
    return statement.replace(
        _HEAD_ROWS, _HEAD_ROWS + "                AND h.event_type <> ALL ($5::text[])\n"
    )


def troubled_endpoints(text: str | None) -> list[BreakerSeen]:
    """The lease's ``troubled_endpoints`` column, read."""
    if not text:
        return []
    return [
        BreakerSeen(
            e["event_type"],
            e["endpoint"],
            e["failures"],
            e["reopen_in"],
            e["probing"],
            bool(e.get("paused")),
        )
        for e in json.loads(text)
    ]


class PostgresStore:
    """The relay's store over ``pool`` (a pool, or one connection): the methods of
    ``RelayStore``, each one statement (or a read before a write) inside the boundary."""

    __slots__ = ("pool",)

    def __init__(self, pool: Connection) -> None:
        self.pool = pool

    @database_boundary
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
        """Claim up to ``batch_size`` due rows for ``lease_seconds``.

        ``hold_on_failure``: a Failed message keeps later ones with its ordering key waiting.
        Payloads above ``max_payload_bytes`` are not fetched (``payload`` is None; the size is
        kept). A lease whose ``taken`` is ``batch_size`` may have left more due, even if it
        leased fewer. ``usual_size``: the size most leases ask for (the batch size setting); a
        lease of that size runs ``lease_statement(batch_size)``, which the server plans once per
        connection. ``skip``: event types whose due messages it reads past
        (``lease_past_statement``); a lease that skips some and comes back short may have left
        others due beyond what it read.
        """
        arguments = (lease_seconds, hold_on_failure, max_payload_bytes)
        if skip:
            rows = await self.pool.fetch(lease_past_statement(), *arguments, batch_size, list(skip))
        elif batch_size == usual_size:
            rows = await self.pool.fetch(lease_statement(batch_size), *arguments)
        else:
            rows = await self.pool.fetch(QUERIES["lease_batch"], *arguments, batch_size)
        # The row that counts the parked messages has no other columns.
        leased = [LeasedMessage.from_row(row) for row in rows if row[_LEASE_TOKEN] is not None]
        if not rows:
            return Lease(leased)
        first = rows[0]
        return Lease(
            leased,
            sum(row["parked"] for row in rows if row[_LEASE_TOKEN] is None),
            first["database_now"],
            troubled_endpoints(first["troubled_endpoints"]),
        )

    @database_boundary
    async def endpoints_tried(
        self, message_ids: Sequence[UUID]
    ) -> dict[UUID, frozenset[str | None]]:
        """The endpoints each message was sent to, by its attempt history; absent: none
        recorded."""
        rows = await self.pool.fetch(QUERIES["endpoints_tried"], list(message_ids))
        return {row["outbox_message_id"]: frozenset(row["endpoints"]) for row in rows}

    @database_boundary
    async def record_outcomes(
        self, records: Sequence[Recorded], *, hold_on_failure: bool = True, retrying: bool = False
    ) -> Written:
        """Write a batch's outcomes and attempt history in one statement.

        ``retrying``: this repeats a write whose reply was lost, so it may have committed;
        nothing is written twice (and what the lost write let go is not known: ``lets_next_go``
        is then True).
        """
        if not records:
            return Written(set())
        messages = [r.message for r in records]
        if retrying and (earlier := await self._written_before(messages)) is not None:
            return earlier
        by_message = zip(*(outcome_row(r) for r in records), strict=True)
        attempts = [attempt_row(r, d) for r in records for d in r.deliveries if attempted(d)]
        by_attempt = zip(*attempts, strict=True) if attempts else [[]] * len(AttemptRow._fields)
        rows = await self.pool.fetch(
            QUERIES["record_outcomes"],
            *map(list, by_message),
            *map(list, by_attempt),
            hold_on_failure,
            *created_range(messages),
        )
        return Written(
            {row["outbox_message_id"] for row in rows}, any(row["lets_next_go"] for row in rows)
        )

    @database_boundary
    async def record_delivered(
        self,
        messages: Sequence[LeasedMessage],
        attempts: Sequence[SentAttempt],
        *,
        hold_on_failure: bool = True,
        retrying: bool = False,
    ) -> Written:
        """``record_outcomes`` for the usual batch: each message answered 2xx by every endpoint
        of its event type, with no endpoint state kept from before (they are all Processed). The
        same rows written, from two arrays per message and six per attempt instead of seven and
        ten."""
        if not messages:
            return Written(set())
        if retrying and (earlier := await self._written_before(messages)) is not None:
            return earlier
        ids = [m.message_id for m in messages]
        by_column = zip(*attempts, strict=True) if attempts else [[]] * len(SentAttempt._fields)
        row = await self.pool.fetchrow(
            QUERIES["record_delivered"],
            ids,
            [m.lease_token for m in messages],
            *map(list, by_column),
            hold_on_failure,
            *created_range(messages),
        )
        return Written(set(ids).difference(row["stale"]), row["lets_next_go"])

    async def _written_before(self, messages: Sequence[LeasedMessage]) -> Written | None:
        """What an outcome write whose reply was lost did, if it committed after all (writing
        again would double the history); None if it did not."""
        ids = [m.message_id for m in messages]
        tokens = [m.lease_token for m in messages]
        earlier = await self.pool.fetchrow(QUERIES["outcomes_written"], ids, tokens)
        if earlier["written"] or earlier["applied"]:
            return Written(set(earlier["applied"]), lets_next_go=True)
        return None

    @database_boundary
    async def release_held(self, *, hold_on_failure: bool = True) -> int:
        """Make due again the parked messages whose wait is over though nothing let them go (the
        message before them was deleted or changed by hand); returns how many."""
        rows = await self.pool.fetch(QUERIES["release_held"], hold_on_failure)
        return len(rows)

    @database_boundary
    async def next_due_in(self) -> float | None:
        """Seconds until the next Pending message comes due, if one waits for a time to come."""
        due_in: float | None = await self.pool.fetchval(QUERIES["next_due_in"])
        return due_in

    async def notify_wakeup(self) -> bool:
        """One wake-up NOTIFY (OUTBOX_WAKEUP=postgres), sent at once where ``pool`` is a pool or
        a connection outside a transaction. Never raises: a lost wake-up is a warning (the row
        is safe; a timer or the sweep takes it); returns whether it was sent."""
        try:
            await self.pool.execute(QUERIES["notify_wakeup"])
        except (*TRANSIENT_ERRORS, asyncpg.PostgresError, OSError) as exc:
            logger.warning(
                "outbox wake-up NOTIFY not sent (the row is safe): %s", type(exc).__name__
            )
            return False
        return True

    @database_boundary
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
        """Count retryable failures of endpoint ``key`` (event type, name), opening its breaker
        at ``threshold`` or after a failed probe; returns the seconds until it reopens, if open."""
        row = await self.pool.fetchrow(
            QUERIES["endpoint_failed"],
            *key,
            failures,
            threshold,
            probe_failed,
            *cool_down,
            list(others),
        )
        reopen_in: float | None = row["reopen_in"]
        return reopen_in if reopen_in is not None and reopen_in > 0 else None

    @database_boundary
    async def endpoint_recovered(self, key: Key) -> None:
        """Endpoint ``key`` answered: close its breaker."""
        await self.pool.execute(QUERIES["endpoint_recovered"], *key)

    @database_boundary
    async def claim_probe(self, key: Key, seconds: float) -> bool:
        """Whether this relay gets to send the probe of endpoint ``key`` (for ``seconds``)."""
        return bool(await self.pool.fetchval(QUERIES["claim_probe"], *key, seconds))

    @database_boundary
    async def paused_keys(self) -> frozenset[Key]:
        """The endpoints paused by an operator, as (event type, name)."""
        rows = await self.pool.fetch(QUERIES["paused_endpoint_keys"])
        return frozenset((row["event_type"], row["endpoint"]) for row in rows)

    @database_boundary
    async def start_limits(
        self, relay: UUID, keys: Sequence[Key], start: StartFrom, *, live_seconds: float
    ) -> Sequence[OwnLimit]:
        """What the other relays keep of ``keys``' limits, handed to ``start``; what it answers is
        kept as ``relay``'s, in one transaction under an advisory lock (``lock_limits``): a relay
        starting meanwhile waits for it, then reads what this one starts from."""
        async with transaction(self.pool) as conn:
            await conn.execute(QUERIES["lock_limits"])
            await conn.execute(QUERIES["forget_limits"], live_seconds)
            rows = await conn.fetch(
                QUERIES["learned_limits"], [k[0] for k in keys], [k[1] for k in keys], relay
            )
            kept = start([LearnedLimit(*row) for row in rows])
            if kept:
                await conn.execute(QUERIES["save_limits"], relay, *_limit_columns(kept))
        return kept

    @database_boundary
    async def save_limits(self, relay: UUID, limits: Sequence[OwnLimit]) -> None:
        """Keep ``relay``'s ``limits``: its row of each endpoint, written over."""
        if limits:
            await self.pool.execute(QUERIES["save_limits"], relay, *_limit_columns(limits))


def _limit_columns(limits: Sequence[OwnLimit]) -> list[list[object]]:
    """``limits`` as one array per column, in ``save_limits``' order."""
    return [list(column) for column in zip(*limits, strict=True)]
