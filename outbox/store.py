"""The only module that speaks SQL. Statements live in ``sql/queries.sql`` under a name each."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib.resources import files
from typing import Any
from uuid import UUID

from outbox.models import LeasedMessage, Outcome
from outbox.settings import DEFAULT_MAX_PAYLOAD_BYTES

# asyncpg ships no type information; a connection or a pool both offer fetch/execute.
Connection = Any

_ENTRY = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def load_queries(text: str) -> dict[str, str]:
    """Split ``-- name --`` sections into ``{name: statement}``; the comment lines are kept."""
    parts = _ENTRY.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES = load_queries(files("outbox").joinpath("sql/queries.sql").read_text(encoding="utf-8"))


async def insert_message(conn: Connection, message_id: UUID, event_type: str, payload: str) -> bool:
    """Insert a Pending row; False if a row with this id already exists."""
    inserted = await conn.fetchval(QUERIES["insert_message"], message_id, event_type, payload)
    return inserted is not None


async def lease_batch(
    conn: Connection,
    batch_size: int,
    lease_seconds: float,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[LeasedMessage]:
    """Claim up to ``batch_size`` due rows for ``lease_seconds``.

    Payloads above ``max_payload_bytes`` are not fetched (``payload`` is None; the size is kept).
    """
    rows = await conn.fetch(QUERIES["lease_batch"], batch_size, lease_seconds, max_payload_bytes)
    return [LeasedMessage.from_row(row) for row in rows]


async def record_outcomes(
    conn: Connection, outcomes: Sequence[tuple[LeasedMessage, Outcome]]
) -> set[UUID]:
    """Write every outcome of a batch in one statement; returns the ids still held by our lease."""
    if not outcomes:
        return set()
    rows = await conn.fetch(
        QUERIES["record_outcomes"],
        [message.message_id for message, _ in outcomes],
        [message.lease_token for message, _ in outcomes],
        [str(outcome.status) for _, outcome in outcomes],
        [outcome.delay_seconds for _, outcome in outcomes],
        [outcome.error for _, outcome in outcomes],
        [outcome.not_attempted for _, outcome in outcomes],
    )
    return {row["outbox_message_id"] for row in rows}
