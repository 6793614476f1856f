"""The store's driver-error boundary: which asyncpg errors are transient, and the one statement it
sends again (a pooled connection the server had just closed refused it before it went out)."""

from __future__ import annotations

import logging
from typing import Any
from unittest.mock import MagicMock

import asyncpg
import pytest

from outbox.core.errors import DatabaseError
from outbox.store.connection import database_boundary

# What asyncpg raises for a statement taken to a pooled connection whose server has just
# terminated it (read the notice, not yet the end of the stream): a lease's cached statement.
REFUSED_UNSENT = "cannot switch to state 12; another operation (2) is in progress"


class Operation:
    """A store operation that raises ``errors`` in turn, then answers ``rows``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self, conn: Any) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "rows"


def pool() -> Any:
    return MagicMock(spec=asyncpg.Pool)


async def test_a_statement_a_closing_pooled_connection_refused_unsent_goes_out_on_a_new_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    operation = Operation(asyncpg.InternalClientError(REFUSED_UNSENT))
    relay_pool = pool()
    with caplog.at_level(logging.WARNING, "outbox.store"):
        assert await database_boundary(operation)(relay_pool) == "rows"
    assert operation.calls == 2
    relay_pool.expire_connections.assert_awaited_once()
    assert "closed by the server before a statement went out (InternalClientError)" in caplog.text


async def test_a_statement_refused_unsent_twice_is_a_transient_database_error() -> None:
    operation = Operation(*[asyncpg.InternalClientError(REFUSED_UNSENT)] * 2)
    with pytest.raises(DatabaseError) as raised:
        await database_boundary(operation)(pool())
    assert (raised.value.transient, raised.value.kind) == (True, "InternalClientError")
    assert str(raised.value) == f"InternalClientError: {REFUSED_UNSENT}"
    assert operation.calls == 2


@pytest.mark.parametrize(
    ("conn", "message"),
    [
        # One connection of the caller's: another try would meet the same closed connection.
        (MagicMock(spec=asyncpg.Connection), REFUSED_UNSENT),
        # Raised once a statement was sent (a reply it did not expect): not sent again.
        (pool(), "_on_result: waiter is None"),
    ],
)
async def test_other_internal_client_errors_are_transient_and_not_sent_again(
    conn: Any, message: str
) -> None:
    operation = Operation(asyncpg.InternalClientError(message))
    with pytest.raises(DatabaseError) as raised:
        await database_boundary(operation)(conn)
    assert (raised.value.transient, raised.value.kind) == (True, "InternalClientError")
    assert operation.calls == 1


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (asyncpg.ConnectionDoesNotExistError("connection was closed in the middle"), True),
        (asyncpg.InterfaceError("connection is closed"), True),
        (asyncpg.InternalClientError(REFUSED_UNSENT), True),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), True),
        (asyncpg.exceptions.TooManyConnectionsError("too many clients"), True),
        (asyncpg.CannotConnectNowError("the database system is starting up"), True),
        (ConnectionRefusedError(111, "Connection refused"), True),
        (TimeoutError(), True),
        (asyncpg.UniqueViolationError("duplicate key"), False),
        (asyncpg.UndefinedTableError('relation "outbox_messages" does not exist'), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
async def test_driver_errors_become_database_errors_transient_where_a_new_connection_may_work(
    error: BaseException, transient: bool
) -> None:
    with pytest.raises(DatabaseError) as raised:
        await database_boundary(Operation(error))(MagicMock(spec=asyncpg.Connection))
    assert (raised.value.transient, raised.value.kind) == (transient, type(error).__name__)
