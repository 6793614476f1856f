"""The store's connections and its driver-error boundary: the only module that opens asyncpg's.

Every function of the store that runs a statement is wrapped by ``database_boundary``, which
turns the driver's errors into one ``DatabaseError`` (transient or not). The pool (``create_pool``),
one connection (``connect``), a connection of a pool (``acquired``), and the execution helpers the
layers above run their named statements with (``execute``, ``fetch``, ``fetchrow``, ``fetchval``).

Fast path here (docs/performance.md, "The fast paths"): ``create_pool`` does not reset a released
connection (``_keep_session``); docs/performance.md#the-pools-release-without-a-reset
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any, ParamSpec, TypeVar

import asyncpg

from outbox.core.errors import DatabaseError, EntraTokenError, describe
from outbox.core.settings import Settings
from outbox.store import entra
from outbox.store.sql import QUERIES, identifier

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
# A statement that runs longer than this fails (TimeoutError) rather than hold a run for ever.
COMMAND_TIMEOUT_SECONDS = 30
# A migration's statement may rewrite or index a table of millions of rows: it is not cut at 30 s
# (its waits for locks are bounded by its lock_timeout instead).
MIGRATION_STATEMENT_TIMEOUT_SECONDS = 24 * 3600

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
    """Whether ``exc`` refused a statement of a pool before it was sent, on a connection the
    server had just closed; if so, the pool's connections are renewed, so that the operation may
    run once more, as it would have on a connection seen to close. The pool is the operation's
    first argument, or that argument's ``pool`` (a ``PostgresStore``'s). Every operation of the
    store that takes a pool runs one statement, or one transaction, or reads before it writes:
    run again, it does nothing twice."""
    first = args[0] if args else None
    pool = first if isinstance(first, asyncpg.Pool) else getattr(first, "pool", None)
    if not (isinstance(pool, asyncpg.Pool) and str(exc).startswith(_NOT_SENT)):
        return False
    logger.warning(
        "database connection closed by the server before a statement went out (%s); "
        "sending it on a new connection",
        type(exc).__name__,
    )
    await pool.expire_connections()
    return True


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
            await conn.execute(f'CREATE DATABASE "{identifier(name)}"')
    finally:
        await conn.close()


@asynccontextmanager
async def acquired(conn: Connection) -> AsyncIterator[Connection]:
    """A connection of the pool ``conn`` (or ``conn`` itself, a connection); a database that
    cannot be reached is a ``DatabaseError`` here too. A pool is anything that ``acquire``s (a
    wrapper around one too: the tests count statements so)."""
    if isinstance(conn, asyncpg.Pool) or callable(getattr(conn, "acquire", None)):
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


@asynccontextmanager
async def transaction(conn: Connection) -> AsyncIterator[Connection]:
    """A connection of ``conn`` (``acquired``) in a transaction that commits when the block ends
    and rolls back when it raises. Its own driver errors (a commit that fails) are raised as they
    are: the caller runs inside ``database_boundary``."""
    async with acquired(conn) as connection, connection.transaction():
        yield connection


def end_session(connection: Connection) -> None:
    """End ``connection``'s session, and with it the locks it holds (the pool makes another)."""
    with suppress(*TRANSIENT_ERRORS):  # lost already: the session has ended
        connection.terminate()


@database_boundary
async def ping(conn: Connection) -> None:
    """Nothing, or DatabaseError where ``conn`` no longer answers."""
    await conn.execute(QUERIES["ping"])


# The execution helpers: one statement (its text: a named entry of a statements file), its
# driver errors raised as DatabaseError. ``statement_timeout``: seconds, None for the connection's
# own (COMMAND_TIMEOUT_SECONDS).


@database_boundary
async def execute(
    conn: Connection, statement: str, *args: Any, statement_timeout: float | None = None
) -> int:
    """Run ``statement``; the rows it touched, as the server counts them (0 when it says none)."""
    status: str = await conn.execute(statement, *args, timeout=statement_timeout)
    count = status.rsplit(" ", 1)[-1]
    return int(count) if count.isdigit() else 0


@database_boundary
async def fetch(
    conn: Connection, statement: str, *args: Any, statement_timeout: float | None = None
) -> list[asyncpg.Record]:
    return list(await conn.fetch(statement, *args, timeout=statement_timeout))


@database_boundary
async def fetchrow(
    conn: Connection, statement: str, *args: Any, statement_timeout: float | None = None
) -> asyncpg.Record | None:
    return await conn.fetchrow(statement, *args, timeout=statement_timeout)


@database_boundary
async def fetchval(
    conn: Connection, statement: str, *args: Any, statement_timeout: float | None = None
) -> Any:
    return await conn.fetchval(statement, *args, timeout=statement_timeout)
