"""Failed messages set back to Pending (``python -m outbox requeue``, ``POST /api/outbox/requeue``):
due now, with a fresh attempt budget, for the endpoints they failed; in batches, each its own
short transaction, so that neither the database nor this process holds all of them at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from outbox.operations import requests, sql
from outbox.operations.requests import RequeueFilter
from outbox.store.connection import Connection, database_boundary, transaction

MAX_LISTED_IDS = 1000


@dataclass(slots=True)
class RequeueReport:
    requeued: int
    dry_run: bool
    message_ids: list[str]  # at most MAX_LISTED_IDS of them
    endpoints: list[str] | None = None  # a dry run's: where they would be sent again

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def requeue(conn: Connection, wanted: RequeueFilter, *, dry_run: bool) -> RequeueReport:
    """Set matching Failed rows back to Pending, due now, with a fresh attempt budget.

    Their attempt history and last_error stay; a dry run only reports what would change.
    """
    wanted = requests.parse(requests.RequeueRequest, asdict(wanted) | {"dry_run": dry_run}).filter
    found = await requeue_failed(
        conn,
        wanted.message_ids,
        wanted.event_type,
        wanted.created_from,
        wanted.created_to,
        dry_run=dry_run,
        listed=MAX_LISTED_IDS,
        endpoint=wanted.endpoint,
        error=wanted.error,
    )
    return RequeueReport(found.total, dry_run, [str(i) for i in found.first_ids], found.endpoints)


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
    only those whose last_error holds that text). In batches of ``batch_size`` rows, each its
    own short transaction; ``listed`` ids are kept."""
    ids = list(message_ids) if message_ids is not None else None
    filters = (ids, event_type, created_from, created_to)
    if dry_run:
        row = await sql.row(conn, "count_failed", *filters, listed, endpoint, error)
        assert row is not None  # one row, whatever matched
        return Requeued(row["total"], list(row["first_ids"]), list(row["endpoints"]))
    total, first = 0, list[UUID]()
    after: tuple[datetime | None, UUID | None] = (None, None)
    while True:
        async with transaction(conn) as connection:
            rows = await requeue_batch(connection, *filters, *after, batch_size, endpoint, error)
        total += len(rows)
        first += [row["outbox_message_id"] for row in rows[: listed - len(first)]]
        if len(rows) < batch_size:
            return Requeued(total, first)
        after = (rows[-1]["created_at"], rows[-1]["outbox_message_id"])


async def requeue_batch(connection: Connection, *args: Any) -> list[dict[str, Any]]:
    """One batch of ``requeue_failed`` (its statement's parameters), inside the caller's
    transaction, planned on its indexes alone: on the partitioned layout the planner would
    otherwise sort every remaining Failed row of a partition for each batch rather than merge
    the partitions' (created_at, id) index in order, or read a partition whole for the batch's
    ids before autovacuum has analysed it (docs/partitioning.md). Its rows in the batch's order,
    (created_at, id): the UPDATE returns them in whatever order it met them (by id, through the
    primary key), and the next batch starts after the last of them in that order, so none is
    met, and requeued, twice."""
    await sql.execute(connection, "plan_on_indexes")
    rows = await sql.rows(connection, "requeue_failed", *args)
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
    async with transaction(conn) as connection:
        row = await sql.row(connection, "lock_action", action_id)
        if row is None or row["result"] is None:
            return RequeueStep([], None)
        progress: dict[str, Any] = json.loads(row["result"])
        if progress.get("done", True):
            return RequeueStep([], progress)
        last = progress["after"]
        after = (datetime.fromisoformat(last[0]), UUID(last[1])) if last else (None, None)
        rows = await requeue_batch(connection, *wanted, *after, batch_size, endpoint, error)
        if rows:
            last = [rows[-1]["created_at"].isoformat(), str(rows[-1]["outbox_message_id"])]
        progress = {
            "requeued": progress["requeued"] + len(rows),
            "batches": progress["batches"] + 1,
            "done": len(rows) < batch_size,
            "after": last,
        }
        await sql.execute(
            connection,
            "finish_action",
            action_id,
            progress["requeued"],
            json.dumps(progress),
            progress["done"],
        )
    return RequeueStep(rows, progress)
