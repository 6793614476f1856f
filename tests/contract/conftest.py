"""The store contract's two stores behind one harness: each test runs against PostgreSQL (this
test's own database) and against ``MemoryStore``, with the same assertions."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import pytest

from outbox import store
from outbox.operations import sql
from outbox.store.memory import MemoryStore


@dataclass(frozen=True)
class RowState:
    """What a test asserts of a message, whichever store holds it."""

    status: str
    attempts: int
    due_in: float | None  # seconds from now until next_attempt_at (math.inf: parked)
    last_error: str | None
    endpoint_state: dict[str, Any] | None


class Harness:
    """A store, and what a test does to it by hand (insert, expire, read) that the relay never
    does; one subclass per store."""

    name: str
    store: store.RelayStore

    async def add(self, event_type: str = "OrderCompleted", key: str | None = None) -> UUID:
        raise NotImplementedError

    async def row(self, message_id: UUID) -> RowState:
        raise NotImplementedError

    async def expire_lease(self, message_id: UUID) -> None:
        """The lease of ``message_id`` ends now (its worker died)."""
        raise NotImplementedError

    async def make_due(self, message_id: UUID) -> None:
        """A Pending message backing off is due now."""
        raise NotImplementedError

    async def attempts(self, message_id: UUID) -> list[tuple[str | None, int, str, bool]]:
        """Its history: (endpoint, attempt number, outcome, applied), in order."""
        raise NotImplementedError

    async def breaker(self, key: tuple[str, str]) -> tuple[int, int, bool] | None:
        """An endpoint's breaker: (failures, opens, open now), or None: closed, nothing counted."""
        raise NotImplementedError

    async def cool_down_over(self, key: tuple[str, str]) -> None:
        """The endpoint's cool-down ends now."""
        raise NotImplementedError

    async def pause(self, key: tuple[str, str]) -> None:
        """An operator pauses the endpoint (``python -m outbox pause``)."""
        raise NotImplementedError

    async def age_limits(self, seconds: float) -> None:
        """Every relay's learned limits were written ``seconds`` earlier than they were."""
        raise NotImplementedError


class PostgresHarness(Harness):
    name = "postgres"

    def __init__(self, db: Any) -> None:
        self.db = db
        self.store = store.PostgresStore(db)

    async def add(self, event_type: str = "OrderCompleted", key: str | None = None) -> UUID:
        statement = store.insert_message(uuid.uuid4(), event_type, "{}", key)
        message_id: UUID = await self.db.fetchval(statement.sql, *statement.args)
        return message_id

    async def row(self, message_id: UUID) -> RowState:
        row = await self.db.fetchrow(
            "SELECT status, attempt_count, last_error, endpoint_state::text AS state,"
            " CASE WHEN next_attempt_at = 'infinity' THEN 'Infinity'::float8"
            " ELSE extract(epoch FROM next_attempt_at - now())::float8 END AS due_in"
            " FROM outbox_messages WHERE outbox_message_id = $1",
            message_id,
        )
        state = json.loads(row["state"]) if row["state"] is not None else None
        return RowState(
            row["status"], row["attempt_count"], row["due_in"], row["last_error"], state
        )

    async def expire_lease(self, message_id: UUID) -> None:
        await self.db.execute(
            "UPDATE outbox_messages SET lease_expires_at = now() - interval '1 s'"
            " WHERE outbox_message_id = $1",
            message_id,
        )

    async def make_due(self, message_id: UUID) -> None:
        await self.db.execute(
            "UPDATE outbox_messages SET next_attempt_at = now() - interval '1 s'"
            " WHERE outbox_message_id = $1",
            message_id,
        )

    async def attempts(self, message_id: UUID) -> list[tuple[str | None, int, str, bool]]:
        rows = await self.db.fetch(
            "SELECT endpoint, attempt_number, outcome, applied FROM outbox_attempts"
            " WHERE outbox_message_id = $1 ORDER BY attempt_id",
            message_id,
        )
        return [(r["endpoint"], r["attempt_number"], r["outcome"], r["applied"]) for r in rows]

    async def breaker(self, key: tuple[str, str]) -> tuple[int, int, bool] | None:
        row = await self.db.fetchrow(
            "SELECT consecutive_failures, opens, COALESCE(reopen_at > now(), false) AS open"
            " FROM outbox_endpoints WHERE event_type = $1 AND endpoint = $2",
            *key,
        )
        return None if row is None else (row[0], row[1], row[2])

    async def cool_down_over(self, key: tuple[str, str]) -> None:
        await self.db.execute(
            "UPDATE outbox_endpoints SET reopen_at = now() - interval '1 s'"
            " WHERE event_type = $1 AND endpoint = $2",
            *key,
        )

    async def pause(self, key: tuple[str, str]) -> None:
        assert await sql.value(self.db, "pause_endpoint", *key, "operator")

    async def age_limits(self, seconds: float) -> None:
        await self.db.execute(
            "UPDATE outbox_endpoint_limits SET updated_at = updated_at - make_interval(secs => $1),"
            " pushed_back_at = pushed_back_at - make_interval(secs => $1)",
            seconds,
        )


class MemoryHarness(Harness):
    name = "memory"

    def __init__(self) -> None:
        self.memory = MemoryStore(clock=time.time)
        self.store = self.memory

    async def add(self, event_type: str = "OrderCompleted", key: str | None = None) -> UUID:
        return self.memory.add(event_type, ordering_key=key)

    async def row(self, message_id: UUID) -> RowState:
        row = self.memory.messages[message_id]
        due_in = math.inf if row.next_attempt_at == math.inf else row.next_attempt_at - time.time()
        state = json.loads(row.endpoint_state) if row.endpoint_state is not None else None
        return RowState(row.status, row.attempt_count, due_in, row.last_error, state)

    async def expire_lease(self, message_id: UUID) -> None:
        self.memory.messages[message_id].lease_expires_at = time.time() - 1

    async def make_due(self, message_id: UUID) -> None:
        self.memory.messages[message_id].next_attempt_at = time.time() - 1

    async def attempts(self, message_id: UUID) -> list[tuple[str | None, int, str, bool]]:
        return [
            (a.endpoint, a.number, a.outcome, a.applied)
            for a in self.memory.attempts
            if a.message_id == message_id
        ]

    async def breaker(self, key: tuple[str, str]) -> tuple[int, int, bool] | None:
        endpoint = self.memory.endpoints.get(key)
        if endpoint is None:
            return None
        is_open = endpoint.reopen_at is not None and endpoint.reopen_at > time.time()
        return (endpoint.failures, endpoint.opens, is_open)

    async def cool_down_over(self, key: tuple[str, str]) -> None:
        self.memory.endpoints[key].reopen_at = time.time() - 1

    async def pause(self, key: tuple[str, str]) -> None:
        self.memory.paused.add(key)

    async def age_limits(self, seconds: float) -> None:
        for row in self.memory.limits.values():
            row.updated_at -= seconds
            if row.pushed_back_at is not None:
                row.pushed_back_at -= seconds


@pytest.fixture(params=["postgres", "memory"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """Each contract test runs once per store."""
    if request.param == "postgres":
        return PostgresHarness(request.getfixturevalue("db"))
    return MemoryHarness()
