"""The only module that speaks SQL, and the only one that knows the relay's driver (asyncpg).

Statements live in ``queries.sql`` (beside this module) under a name each. Every function the
relay calls turns the driver's errors into one ``DatabaseError`` (transient or not) at this
boundary. The statements that run in the caller's transaction (``insert_message``,
``claim_inbox``) are not run here: this module hands them out as a ``Statement`` for the caller's
driver (``outbox.producer.drivers``), and their driver errors are the caller's own.

The fast paths here, each kept for a measured gain (the statements' own are indexed at the top of
``queries.sql``):

- ``lease_statement``: the usual batch size written into the lease, planned once per connection;
  docs/performance.md#the-leases-batch-size-in-its-sql
- ``record_delivered``: a batch all delivered, written from fewer arrays than ``record_outcomes``;
  docs/performance.md#the-lean-outcome-write
- ``OutcomeRow``, ``AttemptRow``, ``SentAttempt``: outcomes bound as one array per column;
  docs/performance.md#outcomes-bound-as-arrays
- ``insert_message(generated_id=True)``: no ``ON CONFLICT`` for an id just generated;
  docs/performance.md#an-insert-without-on-conflict
- ``create_pool``: a released connection is not reset (``_keep_session``);
  docs/performance.md#the-pools-release-without-a-reset
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from importlib.resources import files
from typing import Any, NamedTuple, ParamSpec, TypeVar
from uuid import UUID

import asyncpg

from outbox.core.errors import DatabaseError, EntraTokenError, describe
from outbox.core.models import Delivered, LeasedMessage, Recorded
from outbox.core.outcomes import attempt_facts
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES, WAKEUP_CHANNEL, Settings
from outbox.store import entra

# asyncpg ships no type information; a connection or a pool both offer fetch/execute.
Connection = Any
P = ParamSpec("P")
T = TypeVar("T")

# Errors after which another connection may well succeed: the server is unreachable, the
# connection was lost, the server is shutting down or out of resources.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,  # TimeoutError too
    asyncpg.InterfaceError,
    # A statement sent on a connection the server has just closed, after asyncpg read the
    # server's termination notice but before it saw the end of the stream: the connection is
    # gone, another one will do.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
)
# How asyncpg's InternalClientError begins when a statement was to go out on a connection still
# busy with something else. On a pooled connection that is one whose server has just closed it
# (pg_terminate_backend, a restart, a failover): it has read the termination notice but not yet
# the end of the stream, so the pool, which replaces a connection it has seen close, handed it
# out. Nothing was sent.
_NOT_SENT = "cannot switch to state"

logger = logging.getLogger("outbox.store")


def database_boundary(
    operation: Callable[P, Awaitable[T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Raise every driver error of ``operation`` as a ``DatabaseError``; where a pooled
    connection that the server had just closed refused its statement unsent, run it once more
    on a new connection first (``_renewed_after``)."""

    @functools.wraps(operation)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            try:
                return await operation(*args, **kwargs)
            except asyncpg.InternalClientError as exc:
                if not await _renewed_after(exc, args):
                    raise
            return await operation(*args, **kwargs)
        except EntraTokenError as exc:  # one line already, and never with the token
            raise DatabaseError(str(exc), transient=True, kind=type(exc).__name__) from None
        except TRANSIENT_ERRORS as exc:
            raise DatabaseError(describe(exc), transient=True, kind=type(exc).__name__) from exc
        except asyncpg.PostgresError as exc:
            raise DatabaseError(describe(exc), transient=False, kind=type(exc).__name__) from exc

    return guarded


async def _renewed_after(exc: asyncpg.InternalClientError, args: tuple[object, ...]) -> bool:
    """Whether ``exc`` refused a statement of a pool (the first argument) before it was sent,
    on a connection the server had just closed; if so, the pool's connections are renewed, so
    that the operation may run once more, as it would have on a connection seen to close. Every
    operation here that takes a pool runs one statement, or one transaction, or reads before it
    writes: run again, it does nothing twice."""
    pool = args[0] if args else None
    if not (isinstance(pool, asyncpg.Pool) and str(exc).startswith(_NOT_SENT)):
        return False
    logger.warning(
        "database connection closed by the server before a statement went out (%s); "
        "sending it on a new connection",
        type(exc).__name__,
    )
    await pool.expire_connections()
    return True


_ENTRY = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def load_queries(text: str) -> dict[str, str]:
    """Split ``-- name --`` sections into ``{name: statement}``; the comment lines are kept."""
    parts = _ENTRY.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES = load_queries(files("outbox.store").joinpath("queries.sql").read_text(encoding="utf-8"))
# A statement that runs longer than this fails (TimeoutError) rather than hold a run for ever.
COMMAND_TIMEOUT_SECONDS = 30
# A migration's statement may rewrite or index a table of millions of rows: it is not cut at 30 s
# (its waits for locks are bounded by its lock_timeout instead).
MIGRATION_STATEMENT_TIMEOUT_SECONDS = 24 * 3600


@database_boundary
async def create_pool(settings: Settings) -> Connection:
    """A small pool: one run holds at most four connections (a lease, outcome writes).

    It connects on first use, not here, so an unreachable database surfaces as a run's error.
    """
    return await asyncpg.create_pool(
        settings.database_url.get_secret_value(),
        password=entra.for_settings(settings),  # None: the URL's own
        min_size=0,
        max_size=settings.db_pool_size,
        max_inactive_connection_lifetime=60,
        command_timeout=COMMAND_TIMEOUT_SECONDS,
        reset=_keep_session,
    )


async def _keep_session(conn: Connection) -> None:
    """What the pool does to a connection given back, besides rolling back an open transaction
    (asyncpg always does that): nothing. The relay's statements leave no session state behind
    (no SET, LISTEN, cursor or advisory lock), and asyncpg's default reset would cost a round
    trip and four statements on every release, two per batch."""


@database_boundary
async def connect(url: str, *, password: entra.EntraPassword | None = None) -> Connection:
    """One connection (the commands', and migrations'); ``password`` (an Entra token) or the
    URL's own."""
    return await asyncpg.connect(url, password=password, command_timeout=COMMAND_TIMEOUT_SECONDS)


@database_boundary
async def ensure_database(admin_url: str, name: str) -> None:
    """Create database ``name`` on the server of ``admin_url`` unless it exists."""
    conn = await asyncpg.connect(admin_url)
    try:
        if not await conn.fetchval(QUERIES["database_exists"], name):
            await conn.execute(f'CREATE DATABASE "{_identifier(name)}"')
    finally:
        await conn.close()


def _identifier(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"not a plain database name: {name!r}")
    return name


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


def claim_inbox(webhook_id: str) -> Statement:
    """Record a received webhook id; it returns a row the first time, none once it is recorded."""
    return Statement("claim_inbox", (webhook_id,))


_LEASE_TOKEN = LeasedMessage._fields.index("lease_token")


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


@database_boundary
async def lease_batch(
    conn: Connection,
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
    Payloads above ``max_payload_bytes`` are not fetched (``payload`` is None; the size is kept).
    A lease whose ``taken`` is ``batch_size`` may have left more due, even if it leased fewer.
    ``usual_size``: the size most leases ask for (the batch size setting); a lease of that size
    runs ``lease_statement(batch_size)``, which the server plans once per connection.
    ``skip``: event types whose due messages it reads past (``lease_past_statement``); a lease
    that skips some and comes back short may have left others due beyond what it read.
    """
    arguments = (lease_seconds, hold_on_failure, max_payload_bytes)
    if skip:
        rows = await conn.fetch(lease_past_statement(), *arguments, batch_size, list(skip))
    elif batch_size == usual_size:
        rows = await conn.fetch(lease_statement(batch_size), *arguments)
    else:
        rows = await conn.fetch(QUERIES["lease_batch"], *arguments, batch_size)
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
    conn: Connection, message_ids: Sequence[UUID]
) -> dict[UUID, frozenset[str | None]]:
    """The endpoints each message was sent to, by its attempt history; absent: none recorded."""
    rows = await conn.fetch(QUERIES["endpoints_tried"], list(message_ids))
    return {row["outbox_message_id"]: frozenset(row["endpoints"]) for row in rows}


async def notify_wakeup(conn: Connection) -> bool:
    """One wake-up NOTIFY (OUTBOX_WAKEUP=postgres), sent at once where ``conn`` is a pool or a
    connection outside a transaction. Never raises: a lost wake-up is a warning (the row is
    safe; a timer or the sweep takes it); returns whether it was sent."""
    try:
        await conn.execute(QUERIES["notify_wakeup"])
    except (*TRANSIENT_ERRORS, asyncpg.PostgresError, OSError) as exc:
        logger.warning("outbox wake-up NOTIFY not sent (the row is safe): %s", type(exc).__name__)
        return False
    return True


@database_boundary
async def listen_for_wakeups(
    url: str, on_wakeup: Callable[[], None], on_lost: Callable[[], None]
) -> Connection:
    """A connection of its own LISTENing on the wake-up channel: ``on_wakeup`` at each
    notification, ``on_lost`` when the connection ends. Close it when done."""
    conn = await asyncpg.connect(url, command_timeout=COMMAND_TIMEOUT_SECONDS)
    try:
        conn.add_termination_listener(lambda _conn: on_lost())
        await conn.add_listener(WAKEUP_CHANNEL, lambda *_: on_wakeup())
    except BaseException:
        conn.terminate()
        raise
    return conn


@database_boundary
async def ping(conn: Connection) -> None:
    """Nothing, or DatabaseError where ``conn`` no longer answers."""
    await conn.execute(QUERIES["ping"])


@database_boundary
async def notify_queue_usage(conn: Connection) -> float:
    """The fraction of the server's NOTIFY queue in use, 0 to 1 (pg_notification_queue_usage)."""
    usage: float = await conn.fetchval(QUERIES["notify_queue_usage"])
    return usage


@database_boundary
async def next_due_in(conn: Connection) -> float | None:
    """Seconds until the next Pending message comes due, if one waits for a time to come."""
    due_in: float | None = await conn.fetchval(QUERIES["next_due_in"])
    return due_in


@database_boundary
async def release_held(conn: Connection, *, hold_on_failure: bool = True) -> int:
    """Make due again the parked messages whose wait is over though nothing let them go (the
    message before them was deleted or changed by hand); returns how many."""
    rows = await conn.fetch(QUERIES["release_held"], hold_on_failure)
    return len(rows)


class Written(NamedTuple):
    """What an outcome write applied: the ids still held by our lease, and whether one of them
    let the next message of its ordering key go, due now."""

    applied: set[UUID]
    lets_next_go: bool = False


@database_boundary
async def record_outcomes(
    conn: Connection,
    records: Sequence[Recorded],
    *,
    hold_on_failure: bool = True,
    retrying: bool = False,
) -> Written:
    """Write a batch's outcomes and attempt history in one statement.

    ``retrying``: this repeats a write whose reply was lost, so it may have committed; nothing is
    written twice (and what the lost write let go is not known: ``lets_next_go`` is then True).
    """
    if not records:
        return Written(set())
    messages = [r.message for r in records]
    if retrying and (earlier := await _written_before(conn, messages)) is not None:
        return earlier
    by_message = zip(*(_outcome_row(r) for r in records), strict=True)
    attempts = [_attempt_row(r, d) for r in records for d in r.deliveries if _attempted(d)]
    by_attempt = zip(*attempts, strict=True) if attempts else [[]] * len(AttemptRow._fields)
    rows = await conn.fetch(
        QUERIES["record_outcomes"],
        *map(list, by_message),
        *map(list, by_attempt),
        hold_on_failure,
        *_created_range(messages),
    )
    return Written(
        {row["outbox_message_id"] for row in rows}, any(row["lets_next_go"] for row in rows)
    )


class SentAttempt(NamedTuple):
    """One attempt of ``record_delivered``: an endpoint that answered 2xx. Element i of its
    i-th attempt array, in this order."""

    outbox_message_id: UUID
    endpoint: str
    attempt_number: int
    started_epoch: float
    duration_ms: int
    http_status: int


@database_boundary
async def record_delivered(
    conn: Connection,
    messages: Sequence[LeasedMessage],
    attempts: Sequence[SentAttempt],
    *,
    hold_on_failure: bool = True,
    retrying: bool = False,
) -> Written:
    """``record_outcomes`` for the usual batch: each message answered 2xx by every endpoint of
    its event type, with no endpoint state kept from before (they are all Processed). The same
    rows written, from two arrays per message and six per attempt instead of seven and ten."""
    if not messages:
        return Written(set())
    if retrying and (earlier := await _written_before(conn, messages)) is not None:
        return earlier
    ids = [m.message_id for m in messages]
    by_column = zip(*attempts, strict=True) if attempts else [[]] * len(SentAttempt._fields)
    row = await conn.fetchrow(
        QUERIES["record_delivered"],
        ids,
        [m.lease_token for m in messages],
        *map(list, by_column),
        hold_on_failure,
        *_created_range(messages),
    )
    return Written(set(ids).difference(row["stale"]), row["lets_next_go"])


def _created_range(messages: Sequence[LeasedMessage]) -> tuple[datetime, datetime]:
    """The earliest and latest created_at of ``messages``: on the partitioned layout the
    outcome writes read only the partitions between (docs/partitioning.md)."""
    created = [m.created_at for m in messages]
    return min(created), max(created)


async def _written_before(conn: Connection, messages: Sequence[LeasedMessage]) -> Written | None:
    """What an outcome write whose reply was lost did, if it committed after all (writing again
    would double the history); None if it did not."""
    ids = [m.message_id for m in messages]
    tokens = [m.lease_token for m in messages]
    earlier = await conn.fetchrow(QUERIES["outcomes_written"], ids, tokens)
    if earlier["written"] or earlier["applied"]:
        return Written(set(earlier["applied"]), lets_next_go=True)
    return None


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


def _outcome_row(record: Recorded) -> OutcomeRow:
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


def _attempted(delivered: Delivered) -> bool:
    return not delivered.outcome.not_attempted


def _attempt_row(record: Recorded, delivered: Delivered) -> AttemptRow:
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


@database_boundary
async def backlog_status(conn: Connection, processed_up_to: int | None = None) -> dict[str, Any]:
    """Counts by status, the oldest due / unpublished / failed ages, and expired leases;
    Processed rows counted up to ``processed_up_to`` (None: all)."""
    return dict(await conn.fetchrow(QUERIES["backlog_status"], processed_up_to))


class Requeued(NamedTuple):
    """How many Failed rows a requeue touched (or, dry, would), and the first ids of them."""

    total: int
    first_ids: list[UUID]
    endpoints: list[str] | None = None  # a dry run's: the endpoints it would send to again


@database_boundary
async def requeue_failed(
    conn: Connection,
    message_ids: Sequence[UUID] | None,
    event_type: str | None,
    created_from: datetime | None,
    created_to: datetime | None,
    *,
    dry_run: bool,
    listed: int,
    endpoint: str | None = None,
    batch_size: int = 1000,
    error: str | None = None,
) -> Requeued:
    """Failed rows matching every given filter, set back to Pending unless ``dry_run``, for
    their failed endpoints (``endpoint``: only the rows it failed, and only for it; ``error``:
    only those whose last_error holds that text).

        In batches of ``batch_size`` rows, each its own short transaction, so that neither the
        database nor this process holds all of them at once; ``listed`` ids are kept.
    """
    ids = list(message_ids) if message_ids is not None else None
    filters = (ids, event_type, created_from, created_to)
    if dry_run:
        row = await conn.fetchrow(QUERIES["count_failed"], *filters, listed, endpoint, error)
        return Requeued(row["total"], list(row["first_ids"]), list(row["endpoints"]))
    total, first = 0, list[UUID]()
    after: tuple[datetime | None, UUID | None] = (None, None)
    while True:
        async with acquired(conn) as connection, connection.transaction():
            rows = in_requeue_order(
                await _requeue_batch(connection, *filters, *after, batch_size, endpoint, error)
            )
        total += len(rows)
        first += [row["outbox_message_id"] for row in rows[: listed - len(first)]]
        if len(rows) < batch_size:
            return Requeued(total, first)
        after = (rows[-1]["created_at"], rows[-1]["outbox_message_id"])


async def _requeue_batch(connection: Connection, *args: Any) -> list[Any]:
    """One batch of requeue_failed, inside the caller's transaction, planned on its indexes
    alone: on the partitioned layout the planner would otherwise sort every remaining Failed row
    of a partition for each batch rather than merge the partitions' (created_at, id) index in
    order, or read a partition whole for the batch's ids before autovacuum has analysed it
    (docs/partitioning.md)."""
    await connection.execute("SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off")
    rows: list[Any] = await connection.fetch(QUERIES["requeue_failed"], *args)
    return rows


def in_requeue_order(rows: list[Any]) -> list[Any]:
    """A requeue batch's rows in the batch's order, (created_at, id): the UPDATE returns them in
    whatever order it met them (by id, through the primary key), and the next batch starts after
    the last of them in that order, so none is met, and requeued, twice."""
    return sorted(rows, key=lambda row: (row["created_at"], row["outbox_message_id"]))


class RequeueStep(NamedTuple):
    """One batch of a requeue in batches: the rows it set back to Pending, in the batch's order
    ``(created_at, id)``, and the action's progress after it (``requeued`` so far, ``batches``,
    ``done``, ``after``: where the next batch starts); ``None`` when the action is not recorded."""

    rows: list[dict[str, Any]]
    progress: dict[str, Any] | None


@database_boundary
async def requeue_failed_step(
    conn: Connection,
    action_id: str,
    wanted: Sequence[Any],
    *,
    batch_size: int,
    endpoint: str | None = None,
    error: str | None = None,
) -> RequeueStep:
    """The next batch of the requeue recorded as ``action_id``, after where its progress says
    the last one ended (``wanted``: requeue_failed's $1…$4). The batch and its progress commit
    together, under the action's row lock: a retried call goes on from the last batch that
    committed, and no row is requeued twice under one action. A requeue done already (its last
    batch, or in one call) does nothing more."""
    async with acquired(conn) as connection, connection.transaction():
        row = await connection.fetchrow(QUERIES["lock_action"], action_id)
        if row is None or row["result"] is None:
            return RequeueStep([], None)
        progress: dict[str, Any] = json.loads(row["result"])
        if progress.get("done", True):
            return RequeueStep([], progress)
        last = progress["after"]
        after = (datetime.fromisoformat(last[0]), UUID(last[1])) if last else (None, None)
        rows = [
            dict(r)
            for r in in_requeue_order(
                await _requeue_batch(connection, *wanted, *after, batch_size, endpoint, error)
            )
        ]
        if rows:
            last = [rows[-1]["created_at"].isoformat(), str(rows[-1]["outbox_message_id"])]
        progress = {
            "requeued": progress["requeued"] + len(rows),
            "batches": progress["batches"] + 1,
            "done": len(rows) < batch_size,
            "after": last,
        }
        await connection.execute(
            QUERIES["finish_action"], action_id, progress["requeued"], json.dumps(progress)
        )
    return RequeueStep(rows, progress)


# Where a purge of Processed rows goes on: the (created_at, id) of the last row it deleted.
PurgePosition = tuple[datetime, UUID]


@database_boundary
async def purge_batch(conn: Connection, status: str, older_than_days: int, limit: int) -> int:
    """Delete one bounded batch of old Processed or Failed rows; returns how many went."""
    if status == "Processed":
        deleted, _ = await purge_processed(conn, older_than_days, limit)
        return deleted
    result: str = await conn.execute(QUERIES["purge_failed"], older_than_days, limit)
    return int(result.split()[-1])


@database_boundary
async def purge_processed(
    conn: Connection, older_than_days: int, limit: int, after: PurgePosition | None = None
) -> tuple[int, PurgePosition | None]:
    """Delete one bounded batch of Processed rows finished more than ``older_than_days`` ago,
    read in created order after ``after``; how many went, and the position of the last one
    (None if none went), where the next batch goes on."""
    created_at, message_id = after if after is not None else (None, None)
    row = await conn.fetchrow(
        QUERIES["purge_processed"], older_than_days, limit, created_at, message_id
    )
    assert row is not None  # one row, whatever was deleted
    last = None if row["created_at"] is None else (row["created_at"], row["outbox_message_id"])
    return int(row["deleted"]), last


@database_boundary
async def fetch_message(conn: Connection, message_id: UUID) -> dict[str, Any] | None:
    row = await conn.fetchrow(QUERIES["show_message"], message_id)
    return dict(row) if row is not None else None


@database_boundary
async def fetch_attempts(conn: Connection, message_id: UUID) -> list[dict[str, Any]]:
    return [dict(row) for row in await conn.fetch(QUERIES["show_attempts"], message_id)]


class Bookkeeping(NamedTuple):
    """The statements that record one set of migrations and serialise its migrators: the
    relay's (``outbox_migrations``) or the consumer inbox's (``outbox_inbox_migrations``)."""

    create_table: str
    lock: str
    unlock: str
    applied: str
    record: str


RELAY_MIGRATIONS = Bookkeeping(
    "create_migrations_table",
    "lock_migrations",
    "unlock_migrations",
    "applied_migrations",
    "record_migration",
)
INBOX_MIGRATIONS = Bookkeeping(
    "create_inbox_migrations_table",
    "lock_inbox_migrations",
    "unlock_inbox_migrations",
    "applied_inbox_migrations",
    "record_inbox_migration",
)


@asynccontextmanager
async def migration_lock(
    conn: Connection, bookkeeping: Bookkeeping = RELAY_MIGRATIONS, lock_timeout: str = "0"
) -> AsyncIterator[None]:
    """Serialise migrators (a session-level advisory lock), with the bookkeeping table made.

    Inside, every statement waits at most ``lock_timeout`` (PostgreSQL's syntax, ``'2s'``) for a
    lock; the session's own setting is put back afterwards. The advisory lock is tried every
    0.1 s until taken: no waiter sits in a statement meanwhile (a waiting statement holds a
    snapshot, which the holder's ``CREATE INDEX CONCURRENTLY`` would wait for), nor holds a lock
    of a table."""
    while True:
        if await _fetchval(conn, QUERIES[bookkeeping.lock]):
            break
        await asyncio.sleep(0.1)
    try:
        previous = await _fetchval(conn, QUERIES["show_lock_timeout"])
        await _fetchval(conn, QUERIES["set_lock_timeout"], lock_timeout)
        try:
            await _execute(conn, QUERIES[bookkeeping.create_table])
            yield
        finally:
            await _fetchval(conn, QUERIES["set_lock_timeout"], previous)
    finally:
        await _execute(conn, QUERIES[bookkeeping.unlock])


@database_boundary
async def applied_migrations(
    conn: Connection, bookkeeping: Bookkeeping = RELAY_MIGRATIONS
) -> dict[str, str]:
    """The migrations applied so far, with the checksum each had."""
    rows = await conn.fetch(QUERIES[bookkeeping.applied])
    return {row["name"]: row["checksum"] for row in rows}


@database_boundary
async def apply_migration(
    conn: Connection,
    name: str,
    sql: str,
    checksum: str,
    bookkeeping: Bookkeeping = RELAY_MIGRATIONS,
) -> None:
    """Run one migration and record it, in one transaction."""
    async with conn.transaction():
        await conn.execute(sql, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)
        await conn.execute(QUERIES[bookkeeping.record], name, checksum)


@database_boundary
async def apply_migration_alone(
    conn: Connection,
    name: str,
    sql: str,
    checksum: str,
    bookkeeping: Bookkeeping = RELAY_MIGRATIONS,
    index: str | None = None,
) -> None:
    """Run one statement that cannot run in a transaction (``CREATE INDEX CONCURRENTLY``), then
    record it. ``index``: the index it builds. A build that failed (here, or in a process that
    died) leaves that index INVALID, which ``IF NOT EXISTS`` would take for done: it is dropped
    first. Run again after a failure between the statement and its record, the statement finds
    its work done."""
    if index is not None:
        await build_index_concurrently(conn, index, sql)
    else:
        await conn.execute(sql, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)
    await conn.execute(QUERIES[bookkeeping.record], name, checksum)


@database_boundary
async def build_index_concurrently(conn: Connection, index: str, statement: str) -> None:
    """Run ``statement`` (``CREATE INDEX CONCURRENTLY IF NOT EXISTS index``), dropping first an
    INVALID ``index`` left by a build that failed or whose process died, which ``IF NOT EXISTS``
    would take for done."""
    invalid = await conn.fetchval(QUERIES["invalid_index"], index)
    if invalid is not None:
        await conn.execute(
            f"DROP INDEX CONCURRENTLY IF EXISTS {invalid}",
            timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS,
        )
    await conn.execute(statement, timeout=MIGRATION_STATEMENT_TIMEOUT_SECONDS)


@database_boundary
async def lock_holders(conn: Connection) -> list[dict[str, Any]]:
    """Other sessions that hold a lock on an outbox table or index, oldest transaction first:
    ``pid``, ``application_name``, ``xact_start``, ``seconds`` (in their transaction)."""
    return [dict(row) for row in await conn.fetch(QUERIES["lock_holders"])]


@database_boundary
async def lock_holders_remaining(conn: Connection, holders: Sequence[dict[str, Any]]) -> int:
    """How many of ``holders`` (from ``lock_holders``) are still in the same transaction."""
    pids = [holder["pid"] for holder in holders]
    starts = [holder["xact_start"] for holder in holders]
    remaining: int = await conn.fetchval(QUERIES["lock_holders_remaining"], pids, starts)
    return remaining


@database_boundary
async def purge_inbox_batch(conn: Connection, older_than_days: int, limit: int) -> int:
    """Delete one bounded batch of inbox rows received more than ``older_than_days`` ago."""
    result: str = await conn.execute(QUERIES["purge_inbox"], older_than_days, limit)
    return int(result.split()[-1])


@database_boundary
async def _execute(conn: Connection, statement: str) -> None:
    await conn.execute(statement)


class BreakerSeen(NamedTuple):
    """What a relay's lease tells it of an endpoint whose breaker counts failures or is open."""

    event_type: str
    endpoint: str
    failures: int
    reopen_in: float | None  # seconds until it reopens (negative: it may be probed; None: closed)
    probing: bool
    paused: bool = False  # paused by an operator: its deliveries wait until it is resumed


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


@database_boundary
async def endpoint_failed(
    conn: Connection,
    key: tuple[str, str],
    failures: int,
    *,
    threshold: int,
    probe_failed: bool,
    cool_down: tuple[float, float],
    others: Sequence[str],
) -> float | None:
    """Count retryable failures of endpoint ``key`` (event type, name), opening its breaker at
    ``threshold`` or after a failed probe; returns the seconds until it reopens, if open."""
    row = await conn.fetchrow(
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
async def endpoint_recovered(conn: Connection, key: tuple[str, str]) -> None:
    """Endpoint ``key`` answered: close its breaker."""
    await conn.execute(QUERIES["endpoint_recovered"], *key)


@database_boundary
async def claim_probe(conn: Connection, key: tuple[str, str], seconds: float) -> bool:
    """Whether this relay gets to send the probe of endpoint ``key`` (for ``seconds``)."""
    return bool(await conn.fetchval(QUERIES["claim_probe"], *key, seconds))


@database_boundary
async def open_breakers(conn: Connection) -> list[dict[str, Any]]:
    return [dict(row) for row in await conn.fetch(QUERIES["open_breakers"])]


@database_boundary
async def _fetchval(conn: Connection, statement: str, *args: Any) -> Any:
    return await conn.fetchval(statement, *args)


class PostgresStore:
    """The relay's store (``outbox.store.contract.RelayStore``) over a pool: each call hands back
    the coroutine of this module's function of the same name, so the relay's path awaits no
    frame of its own here."""

    __slots__ = ("pool",)

    def __init__(self, pool: Connection) -> None:
        self.pool = pool

    def lease_batch(
        self,
        batch_size: int,
        lease_seconds: float,
        *,
        hold_on_failure: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        usual_size: int | None = None,
        skip: Sequence[str] = (),
    ) -> Coroutine[Any, Any, Lease]:
        return lease_batch(
            self.pool,
            batch_size,
            lease_seconds,
            hold_on_failure=hold_on_failure,
            max_payload_bytes=max_payload_bytes,
            usual_size=usual_size,
            skip=skip,
        )

    def endpoints_tried(
        self, message_ids: Sequence[UUID]
    ) -> Coroutine[Any, Any, dict[UUID, frozenset[str | None]]]:
        return endpoints_tried(self.pool, message_ids)

    def record_outcomes(
        self, records: Sequence[Recorded], *, hold_on_failure: bool = True, retrying: bool = False
    ) -> Coroutine[Any, Any, Written]:
        return record_outcomes(
            self.pool, records, hold_on_failure=hold_on_failure, retrying=retrying
        )

    def record_delivered(
        self,
        messages: Sequence[LeasedMessage],
        attempts: Sequence[SentAttempt],
        *,
        hold_on_failure: bool = True,
        retrying: bool = False,
    ) -> Coroutine[Any, Any, Written]:
        return record_delivered(
            self.pool, messages, attempts, hold_on_failure=hold_on_failure, retrying=retrying
        )

    def release_held(self, *, hold_on_failure: bool = True) -> Coroutine[Any, Any, int]:
        return release_held(self.pool, hold_on_failure=hold_on_failure)

    def next_due_in(self) -> Coroutine[Any, Any, float | None]:
        return next_due_in(self.pool)

    def notify_wakeup(self) -> Coroutine[Any, Any, bool]:
        return notify_wakeup(self.pool)

    def endpoint_failed(
        self,
        key: tuple[str, str],
        failures: int,
        *,
        threshold: int,
        probe_failed: bool,
        cool_down: tuple[float, float],
        others: Sequence[str],
    ) -> Coroutine[Any, Any, float | None]:
        return endpoint_failed(
            self.pool,
            key,
            failures,
            threshold=threshold,
            probe_failed=probe_failed,
            cool_down=cool_down,
            others=others,
        )

    def endpoint_recovered(self, key: tuple[str, str]) -> Coroutine[Any, Any, None]:
        return endpoint_recovered(self.pool, key)

    def claim_probe(self, key: tuple[str, str], seconds: float) -> Coroutine[Any, Any, bool]:
        return claim_probe(self.pool, key, seconds)

    def paused_keys(self) -> Coroutine[Any, Any, frozenset[tuple[str, str]]]:
        return paused_keys(self.pool)


class MessageFilter(NamedTuple):
    """The console's message filters, each applied when not None (``endpoint_of``: the event
    types that have the endpoint ``endpoint``)."""

    status: str | None = None
    event_type: str | None = None
    endpoint: str | None = None
    endpoint_of: Sequence[str] | None = None
    ordering_key: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error: str | None = None


# The rows one call of the console's list reads at most (console_messages): a filter no index
# serves answers from the newest this many rows, with a cursor to go on searching.
CONSOLE_SCAN_LIMIT = 20_000


def console_statement() -> str:
    """``console_messages`` with the rows it reads, the ``console_scanned`` clause, spliced in."""
    statement = QUERIES["console_messages"]
    if statement.count("FROM console_scanned AS scanned") != 2:
        raise ValueError("console_messages no longer has the shape console_scanned is spliced into")
    clause = QUERIES["console_scanned"].strip().rstrip(";")
    return statement.replace("FROM console_scanned AS scanned", f"FROM ({clause}) AS scanned")


def console_message_arguments(
    wanted: MessageFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    scan_limit: int | None = None,
) -> tuple[Any, ...]:
    """console_messages' parameters, in order (``scan_limit``: ``CONSOLE_SCAN_LIMIT``)."""
    return (
        wanted.status,
        wanted.event_type,
        list(wanted.endpoint_of) if wanted.endpoint_of is not None else None,
        wanted.endpoint,
        wanted.ordering_key,
        wanted.created_from,
        wanted.created_to,
        wanted.error,
        *(after or (None, None)),
        limit,
        wanted.status,
        scan_limit or CONSOLE_SCAN_LIMIT,
    )


@database_boundary
async def console_messages(
    conn: Connection,
    wanted: MessageFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    *,
    timeout_ms: int,
    scan_limit: int | None = None,
) -> list[dict[str, Any]]:
    """One page of messages matching ``wanted``, newest first, after the row ``after``, found
    among at most ``scan_limit`` rows (``CONSOLE_SCAN_LIMIT``); when the scan stopped there, a
    last row with ``scan_end`` true is where it stopped. A statement slower than ``timeout_ms``
    is cancelled (``QueryCanceledError``). Planned for its parameters each time (a generic
    plan would not know which index a status or a time range can use)."""
    arguments = console_message_arguments(wanted, after, limit, scan_limit)
    async with acquired(conn) as connection, connection.transaction():
        await connection.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
        await connection.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        rows = await connection.fetch(console_statement(), *arguments)
    return [dict(row) for row in rows]


@asynccontextmanager
async def acquired(conn: Connection) -> AsyncIterator[Connection]:
    """A connection of the pool ``conn`` (or ``conn`` itself, a connection); a database that
    cannot be reached is a ``DatabaseError`` here too."""
    if isinstance(conn, asyncpg.Pool):
        connection = await _acquire(conn)
        try:
            yield connection
        finally:
            await conn.release(connection)
    else:
        yield conn


@database_boundary
async def _acquire(pool: asyncpg.Pool) -> Connection:
    return await pool.acquire()


@database_boundary
async def console_overview(conn: Connection, failed_sample: int) -> dict[str, Any]:
    """The console's figures besides the backlog's: rates per minute over the last hour, the
    failures by reason (of the latest ``failed_sample`` Failed), held keys."""
    rates = await conn.fetch(QUERIES["console_rates"])
    reasons = await conn.fetch(QUERIES["console_failure_reasons"], failed_sample)
    held = await conn.fetch(QUERIES["console_held_keys"])
    return {
        "rates": [dict(row) for row in rates],
        "failure_reasons": [dict(row) for row in reasons],
        "held_keys": [dict(row) for row in held],
    }


@database_boundary
async def paused_endpoints(conn: Connection) -> list[dict[str, Any]]:
    return [dict(row) for row in await conn.fetch(QUERIES["paused_endpoints"])]


@database_boundary
async def paused_keys(conn: Connection) -> frozenset[tuple[str, str]]:
    """The endpoints paused by an operator, as (event type, name)."""
    rows = await conn.fetch(QUERIES["paused_endpoint_keys"])
    return frozenset((row["event_type"], row["endpoint"]) for row in rows)


@database_boundary
async def pause_endpoint(conn: Connection, key: tuple[str, str], actor: str) -> bool:
    """Pause endpoint ``key`` (event type, name); False if it was paused already."""
    return bool(await conn.fetchval(QUERIES["pause_endpoint"], *key, actor))


@database_boundary
async def resume_endpoint(conn: Connection, key: tuple[str, str]) -> tuple[bool, int]:
    """Resume endpoint ``key``: whether it was paused, and how many messages are due now."""
    row = await conn.fetchrow(QUERIES["resume_endpoint"], *key)
    return bool(row["resumed"]), int(row["due"])


@database_boundary
async def claim_action(
    conn: Connection, action_id: str, action: str, filter_json: str, *, dry_run: bool, actor: str
) -> bool:
    """Record an action before it is done; False when an action of that id was recorded."""
    row = await conn.fetchrow(
        QUERIES["claim_action"], action_id, action, filter_json, dry_run, actor
    )
    return row is not None


@database_boundary
async def finish_action(conn: Connection, action_id: str, affected: int, result: str) -> None:
    await conn.execute(QUERIES["finish_action"], action_id, affected, result)


@database_boundary
async def show_action(conn: Connection, action_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(QUERIES["show_action"], action_id)
    return dict(row) if row is not None else None


@database_boundary
async def list_actions(conn: Connection, limit: int) -> list[dict[str, Any]]:
    return [dict(row) for row in await conn.fetch(QUERIES["list_actions"], limit)]


@database_boundary
async def resend_processed(
    conn: Connection, message_id: UUID, endpoint: str | None, names: Sequence[str]
) -> bool:
    """Send Processed message ``message_id`` again (to ``endpoint`` alone, of ``names``, or to
    all); False if it is not Processed."""
    return (
        await conn.fetchval(QUERIES["resend_processed"], message_id, endpoint, list(names))
        is not None
    )


@database_boundary
async def resend_started(conn: Connection, message_id: UUID) -> datetime | None:
    """When ``message_id`` was first resent from the console, if ever."""
    moment: datetime | None = await conn.fetchval(QUERIES["resend_started"], str(message_id))
    return moment


@database_boundary
async def endpoint_activity(conn: Connection) -> list[dict[str, Any]]:
    """Each endpoint's attempts over the last hour: last success and failure, counts."""
    return [dict(row) for row in await conn.fetch(QUERIES["endpoint_activity"])]
