"""The lease statement's plan: finished rows must never be scanned, however many accumulate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from outbox.core.models import LeasedMessage
from outbox.store import QUERIES
from outbox.store.postgres import lease_statement
from tests.support.outbox_helpers import seed

DUE_INDEX = "outbox_messages_due_idx"
# Where the lease takes the due rows without a key beside rows behind held keys.
PENDING_UNKEYED_INDEX = "outbox_messages_pending_unkeyed_idx"

# Years of traffic in one statement: finished rows older than the due ones, as they would be.
FILL = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, processed_at, last_error, created_at)
SELECT gen_random_uuid(), 'OrderCompleted', jsonb_build_object('orderId', g), $2,
       CASE WHEN $2 = 'Pending' THEN 0 ELSE 1 END,
       now() - interval '30 days' + g * interval '1 ms',
       CASE WHEN $2 = 'Processed' THEN now() - interval '30 days' END,
       CASE WHEN $2 = 'Failed' THEN 'gave up after 10 attempts: HTTP 500' END,
       now() - interval '31 days' + g * interval '1 ms'
FROM generate_series(1, $1) AS g
"""

# Lease seconds, hold on failure, payload limit, batch size: as lease_batch binds them.
LEASE_ARGUMENTS = (60.0, True, 1_048_576, 100)


def scans(plan: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(node type, relation, index)`` for every scan node of a plan, depth first."""
    if "Scan" in plan["Node Type"]:
        yield plan["Node Type"], plan.get("Relation Name", ""), plan.get("Index Name", "")
    for child in plan.get("Plans", []):
        yield from scans(child)


async def lease_plan(db: Any) -> list[tuple[str, str, str]]:
    raw = await db.fetchval(f"EXPLAIN (FORMAT JSON) {QUERIES['lease_batch']}", *LEASE_ARGUMENTS)
    document = json.loads(raw) if isinstance(raw, str) else raw
    return list(scans(document[0]["Plan"]))


async def test_the_lease_reads_only_the_partial_index_among_many_finished_rows(db: Any) -> None:
    await db.execute(FILL, 200_000, "Processed")
    await db.execute(FILL, 20_000, "Failed")
    await db.execute(FILL, 500, "Pending")
    await db.execute("ANALYZE outbox_messages")

    used = await lease_plan(db)

    assert any(index == DUE_INDEX for _, _, index in used), used
    assert any(index == PENDING_UNKEYED_INDEX for _, _, index in used), used
    assert not [s for s in used if s[0] == "Seq Scan" and s[1] == "outbox_messages"], used
    # The plan is not only chosen but right: it leases the oldest due rows, and only those.
    oldest = await db.fetch(
        "SELECT outbox_message_id FROM outbox_messages WHERE status = 'Pending' "
        "ORDER BY next_attempt_at, created_at LIMIT 100"
    )
    leased = await db.fetch(QUERIES["lease_batch"], *LEASE_ARGUMENTS)
    assert {r["outbox_message_id"] for r in leased} == {r["outbox_message_id"] for r in oldest}


async def test_the_lease_returns_a_leased_message_s_fields_first_and_in_order(db: Any) -> None:
    # LeasedMessage is made from the row by position: the statement's columns must follow it.
    [message_id] = await seed(db)
    [row] = await db.fetch(QUERIES["lease_batch"], *LEASE_ARGUMENTS)
    columns = list(row.keys())
    assert columns[: len(LeasedMessage._fields)] == [
        "outbox_message_id",
        "event_type",
        "payload",
        "payload_bytes",
        "attempt_count",
        "lease_token",
        "created_at",
        "ordering_key",
        "endpoint_state",
        "trace_context",
    ]
    message = LeasedMessage.from_row(row)
    assert (message.message_id, message.event_type, message.attempt) == (
        message_id,
        "OrderCompleted",
        1,
    )
    assert message.lease_token == row["lease_token"]


async def test_the_usual_lease_is_planned_once_and_reads_only_the_partial_index(db: Any) -> None:
    await db.execute(FILL, 200_000, "Processed")
    await db.execute(FILL, 20_000, "Failed")
    await db.execute(FILL, 500, "Pending")
    await db.execute("ANALYZE outbox_messages")
    statement, arguments = lease_statement(100), LEASE_ARGUMENTS[:3]

    # The plan the server keeps (made for no parameter value) reads the partial index too.
    await db.execute("SET plan_cache_mode = force_generic_plan")
    await db.execute(f"PREPARE usual_lease AS {statement}")
    raw = await db.fetchval("EXPLAIN (FORMAT JSON) EXECUTE usual_lease(60, true, 1048576)")
    await db.execute("DEALLOCATE usual_lease; RESET plan_cache_mode")
    document = json.loads(raw) if isinstance(raw, str) else raw
    used = list(scans(document[0]["Plan"]))
    assert any(index == DUE_INDEX for _, _, index in used), used
    assert not [s for s in used if s[0] == "Seq Scan" and s[1] == "outbox_messages"], used

    # And the server keeps it: after its first few plans, no more planning at each lease.
    for _ in range(8):
        transaction = db.transaction()
        await transaction.start()
        assert len(await db.fetch(statement, *arguments)) == 100
        await transaction.rollback()
    plans = await db.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1",
        statement,
    )
    assert plans["generic_plans"] >= 3, dict(plans)
