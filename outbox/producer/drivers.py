"""Drivers as adapters: what ``enqueue`` and the inbox's ``claim`` need from a caller's connection.

Both run one statement in the caller's transaction. An adapter knows, for one kind of connection,
whether a statement run now would commit on its own (then there is no transaction to be atomic
with), how to run a ``store.Statement`` and tell whether it returned a row, whether a transaction
is open, and how ``transaction()`` opens one. Connections are recognised by the module of their
class (or of a base class), so a driver is imported only once one of its connections is passed in.

"A statement would commit on its own" means, per driver:

- asyncpg: outside ``conn.transaction()`` (``conn.is_in_transaction()`` is false);
- psycopg: in autocommit mode with no transaction open (``conn.info.transaction_status``). Outside
  autocommit mode psycopg begins a transaction with the first statement, ours included, which only
  the caller's ``commit()`` (or the end of ``with conn:``) commits;
- SQLAlchemy: the connection is in ``AUTOCOMMIT`` isolation. Otherwise a session or connection
  begins a transaction with the first statement (autobegin), which only its ``commit()`` commits.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from outbox.core.errors import OutdatedSchemaError
from outbox.store import Statement

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.engine import Connection, Dialect
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session

ASYNC_KINDS = (
    "an asyncpg connection (or pool connection), a psycopg.AsyncConnection, or a SQLAlchemy "
    "AsyncSession or AsyncConnection"
)
SYNC_KINDS = (
    "a psycopg.Connection, or a SQLAlchemy Session or Connection (psycopg or psycopg2 driver)"
)
# The public names of each operation: the awaitable one and its synchronous twin.
ASYNC_NAMES = {
    "enqueue": "outbox.enqueue",
    "claim": "outbox.inbox.claim",
    "transaction": "outbox.transaction",
}
_FAMILIES = ("asyncpg", "psycopg", "sqlalchemy")
# SQLAlchemy's PostgreSQL drivers whose parameter style the statements are rewritten for.
_SQLALCHEMY_DRIVERS = ("asyncpg", "psycopg", "psycopg2")
_PLACEHOLDER = re.compile(r"\$(\d+)")
# PostgreSQL's undefined_column, undefined_table and undefined_function: what an older schema
# answers a statement of a newer package (e.g. trace_context, added by migration 0008, or
# outbox_insert_message, 0019).
_OUTDATED_SCHEMA = frozenset({"42703", "42P01", "42883"})


class AsyncDriver(Protocol):
    """An awaitable connection or session of the caller's."""

    begin_hint: str  # how the caller opens a transaction, for error messages

    async def autocommits(self) -> bool: ...

    async def in_transaction(self) -> bool: ...

    async def returns_row(self, statement: Statement) -> bool: ...

    async def rows(self, statement: Statement) -> list[tuple[Any, ...]]: ...

    def transaction(self) -> AbstractAsyncContextManager[object]: ...


class SyncDriver(Protocol):
    """A synchronous connection or session of the caller's."""

    begin_hint: str

    def autocommits(self) -> bool: ...

    def in_transaction(self) -> bool: ...

    def returns_row(self, statement: Statement) -> bool: ...

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]: ...

    def transaction(self) -> AbstractContextManager[object]: ...


def async_driver(conn: object, operation: str) -> AsyncDriver:
    """The adapter for ``conn``; a TypeError naming what ``operation`` accepts otherwise."""
    adapter = _async_adapter(conn)
    if adapter is not None:
        return adapter
    if _sync_adapter(conn) is not None:
        raise TypeError(f"{kind(conn)} is synchronous: use outbox.sync.{operation}")
    raise TypeError(f"{ASYNC_NAMES[operation]} needs {ASYNC_KINDS}, not {kind(conn)}")


def sync_driver(conn: object, operation: str) -> SyncDriver:
    """The adapter for ``conn``; a TypeError naming what ``operation`` accepts otherwise."""
    adapter = _sync_adapter(conn)
    if adapter is not None:
        return adapter
    if _async_adapter(conn) is not None:
        raise TypeError(f"{kind(conn)} is asynchronous: use await {ASYNC_NAMES[operation]}")
    raise TypeError(f"outbox.sync.{operation} needs {SYNC_KINDS}, not {kind(conn)}")


def kind(conn: object) -> str:
    """The class of ``conn`` by its full name (never its value, which may hold a password)."""
    return f"{type(conn).__module__}.{type(conn).__qualname__}"


def _family(conn: object) -> str:
    """The driver library ``conn``'s class (or a base class of it) comes from, if a known one."""
    for cls in type(conn).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in _FAMILIES:
            return root
    return ""


def _async_adapter(conn: object) -> AsyncDriver | None:
    family = _family(conn)
    if family == "asyncpg" and hasattr(conn, "is_in_transaction"):
        return _Asyncpg(conn)
    if family == "psycopg":
        import psycopg  # noqa: PLC0415 - loaded already: conn is one of its connections

        return _AsyncPsycopg(conn) if isinstance(conn, psycopg.AsyncConnection) else None
    if family == "sqlalchemy":
        from sqlalchemy.ext import asyncio as sa  # noqa: PLC0415 - as above

        if isinstance(conn, sa.async_scoped_session):
            conn = conn()
        if isinstance(conn, sa.AsyncSession | sa.AsyncConnection):
            return _AsyncSqlAlchemy(conn)
    return None


def _sync_adapter(conn: object) -> SyncDriver | None:
    family = _family(conn)
    if family == "psycopg":
        import psycopg  # noqa: PLC0415 - loaded already: conn is one of its connections

        return _SyncPsycopg(conn) if isinstance(conn, psycopg.Connection) else None
    if family == "sqlalchemy":
        from sqlalchemy.engine import Connection  # noqa: PLC0415 - as above
        from sqlalchemy.orm import Session, scoped_session  # noqa: PLC0415

        if isinstance(conn, scoped_session):
            conn = conn()
        if isinstance(conn, Session | Connection):
            return _SyncSqlAlchemy(conn)
    return None


class _Asyncpg:
    begin_hint = "async with conn.transaction(): ..."

    def __init__(self, conn: Any) -> None:  # asyncpg ships no types
        self._conn = conn

    async def autocommits(self) -> bool:
        return not await self.in_transaction()

    async def in_transaction(self) -> bool:
        return bool(self._conn.is_in_transaction())

    async def returns_row(self, statement: Statement) -> bool:
        return await self._conn.fetchrow(statement.sql, *statement.args) is not None

    async def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self._conn.fetch(statement.sql, *statement.args)]

    def transaction(self) -> AbstractAsyncContextManager[object]:
        transaction: AbstractAsyncContextManager[object] = self._conn.transaction()
        return transaction


class _AsyncPsycopg:
    begin_hint = "async with conn.transaction(): ..."

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def autocommits(self) -> bool:
        return _psycopg_autocommits(self._conn)

    async def in_transaction(self) -> bool:
        return _psycopg_in_transaction(self._conn)

    async def returns_row(self, statement: Statement) -> bool:
        async with self._conn.cursor() as cursor:
            await cursor.execute(pyformat(statement.sql), named_args(statement))
            return await cursor.fetchone() is not None

    async def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        async with self._conn.cursor() as cursor:
            await cursor.execute(pyformat(statement.sql), named_args(statement))
            return [tuple(row) for row in await cursor.fetchall()]

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self._conn.transaction()


class _SyncPsycopg:
    begin_hint = "with conn.transaction(): ..."

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def autocommits(self) -> bool:
        return _psycopg_autocommits(self._conn)

    def in_transaction(self) -> bool:
        return _psycopg_in_transaction(self._conn)

    def returns_row(self, statement: Statement) -> bool:
        with self._conn.cursor() as cursor:
            cursor.execute(pyformat(statement.sql), named_args(statement))
            return cursor.fetchone() is not None

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        with self._conn.cursor() as cursor:
            cursor.execute(pyformat(statement.sql), named_args(statement))
            return [tuple(row) for row in cursor.fetchall()]

    def transaction(self) -> AbstractContextManager[object]:
        return self._conn.transaction()


def _psycopg_autocommits(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    from psycopg.pq import TransactionStatus  # noqa: PLC0415 - loaded already (conn is psycopg's)

    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def _psycopg_in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    from psycopg.pq import TransactionStatus  # noqa: PLC0415 - loaded already (conn is psycopg's)

    status = conn.info.transaction_status
    return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class _AsyncSqlAlchemy:
    def __init__(self, target: AsyncSession | AsyncConnection) -> None:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415 - loaded already

        self._target = target
        holder = "session" if isinstance(target, AsyncSession) else "conn"
        self.begin_hint = f"async with {holder}.begin(): ..."

    async def _connection(self) -> AsyncConnection:
        from sqlalchemy.ext.asyncio import AsyncSession  # noqa: PLC0415 - loaded already

        if isinstance(self._target, AsyncSession):
            connection = await self._target.connection()
        else:
            connection = self._target
        check_dialect(connection.dialect)
        return connection

    async def autocommits(self) -> bool:
        raw = await (await self._connection()).get_raw_connection()
        return bool(getattr(raw.dbapi_connection, "autocommit", False))

    async def in_transaction(self) -> bool:
        return self._target.in_transaction()

    async def returns_row(self, statement: Statement) -> bool:
        connection = await self._connection()
        sql, parameters = for_dialect(connection.dialect, statement)
        result = await connection.exec_driver_sql(sql, parameters)
        return result.first() is not None

    async def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        connection = await self._connection()
        sql, parameters = for_dialect(connection.dialect, statement)
        result = await connection.exec_driver_sql(sql, parameters)
        return [tuple(row) for row in result.all()]

    def transaction(self) -> AbstractAsyncContextManager[object]:
        return self._target.begin()


class _SyncSqlAlchemy:
    def __init__(self, target: Session | Connection) -> None:
        from sqlalchemy.orm import Session  # noqa: PLC0415 - loaded already

        self._target = target
        holder = "session" if isinstance(target, Session) else "conn"
        self.begin_hint = f"with {holder}.begin(): ..."

    def _connection(self) -> Connection:
        from sqlalchemy.orm import Session  # noqa: PLC0415 - loaded already

        connection = (
            self._target.connection() if isinstance(self._target, Session) else self._target
        )
        check_dialect(connection.dialect)
        return connection

    def autocommits(self) -> bool:
        dbapi_connection = self._connection().connection.dbapi_connection
        return bool(getattr(dbapi_connection, "autocommit", False))

    def in_transaction(self) -> bool:
        return self._target.in_transaction()

    def returns_row(self, statement: Statement) -> bool:
        connection = self._connection()
        sql, parameters = for_dialect(connection.dialect, statement)
        return connection.exec_driver_sql(sql, parameters).first() is not None

    def rows(self, statement: Statement) -> list[tuple[Any, ...]]:
        connection = self._connection()
        sql, parameters = for_dialect(connection.dialect, statement)
        return [tuple(row) for row in connection.exec_driver_sql(sql, parameters).all()]

    def transaction(self) -> AbstractContextManager[object]:
        return self._target.begin()


def check_dialect(dialect: Dialect) -> None:
    """Refuse, before any statement, a database or driver the statements are not written for."""
    if dialect.name != "postgresql" or dialect.driver not in _SQLALCHEMY_DRIVERS:
        raise TypeError(
            "outbox needs a PostgreSQL database through SQLAlchemy's asyncpg, psycopg or "
            f"psycopg2 driver, not {dialect.name}+{dialect.driver}"
        )


def for_dialect(dialect: Dialect, statement: Statement) -> tuple[str, Any]:
    """``statement`` as SQLAlchemy's ``exec_driver_sql`` takes it for ``dialect``'s driver."""
    check_dialect(dialect)
    if dialect.paramstyle == "numeric_dollar":  # asyncpg's own $1…$n
        return statement.sql, statement.args
    return pyformat(statement.sql), named_args(statement)


@functools.cache
def pyformat(sql: str) -> str:
    """``sql`` with ``$n`` written as ``%(pn)s`` (psycopg's named placeholders, also SQLAlchemy's
    psycopg2 dialect's), literal ``%`` doubled, and its comment lines left out."""
    lines = (line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return _PLACEHOLDER.sub(r"%(p\1)s", "\n".join(lines).replace("%", "%%"))


def named_args(statement: Statement) -> dict[str, Any]:
    """The arguments for ``pyformat(statement.sql)``: ``$1`` is ``p1``."""
    return {f"p{number}": value for number, value in enumerate(statement.args, start=1)}


@contextmanager
def outdated_schema_errors() -> Iterator[None]:
    """Raise any driver's "no such column" or "no such table" error of the outbox's own
    statement as OutdatedSchemaError, saying what to do."""
    try:
        yield
    except Exception as exc:
        cause = next((e for e in _chain(exc) if _sqlstate(e)), None)
        if cause is None or _sqlstate(cause) not in _OUTDATED_SCHEMA:
            raise
        detail = str(cause).partition("\n")[0].rpartition(": ")[2] if str(cause) else ""
        raise OutdatedSchemaError(
            "the outbox schema is older than this package: run `python -m outbox migrate` "
            f"(then deploy producers and relay){f'; {detail}' if detail else ''}"
        ) from exc


def _sqlstate(error: BaseException) -> str | None:
    """PostgreSQL's error code as a driver gives it (psycopg2 calls it ``pgcode``)."""
    code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    return code if isinstance(code, str) else None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, the driver error SQLAlchemy wraps (``orig``) and their causes, innermost last."""
    found: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        error = pending.pop()
        if error is None or any(error is seen for seen in found):
            continue
        found.append(error)
        pending += [error.__cause__, getattr(error, "orig", None)]
    return found[::-1]
