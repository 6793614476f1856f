"""Operations over many rows keep the relay's memory flat: they work in batches."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox import operations
from outbox.operations.sql import QUERIES
from tests.support.instrumented_relay import memory_growth_kib
from tests.support.outbox_helpers import statuses
from tests.support.relay_process import relay_env, run_relay

FAILED_ROWS = 200_000

FILL_FAILED = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             last_error, created_at)
SELECT gen_random_uuid(), 'OrderCompleted', '{}', 'Failed', 10, 'HTTP 410',
       now() - interval '1 day' + g * interval '1 ms'
FROM generate_series(1, $1) AS g
"""


@pytest.mark.slow
async def test_requeue_of_every_failed_row_keeps_memory_flat(
    db: Any, database_url: str, webhooks: dict[str, Any]
) -> None:
    await db.execute(FILL_FAILED, FAILED_ROWS)
    result = await run_relay(
        relay_env(database_url, webhooks),
        "--",
        "requeue",
        "--all-failed",
        "--yes",
        module="tests.support.instrumented_relay",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["requeued"], len(report["message_ids"])) == (FAILED_ROWS, 1000)
    assert await statuses(db) == {"Pending": FAILED_ROWS}
    # Fetching every id used to cost about 155 bytes per row (31 MB here); batches cost none.
    assert memory_growth_kib(result.stderr) < 8 * 1024


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", []) for node in plan_nodes(child))]


async def test_requeue_pages_rows_sharing_one_created_at_without_sorting_them(db: Any) -> None:
    # One transaction's rows share one created_at: each batch used to sort every remaining row.
    rows = 20_000
    await db.execute(FILL_FAILED.replace("g * interval '1 ms'", "interval '0'"), rows)
    await db.execute("ANALYZE outbox_messages")
    middle = await db.fetchrow(
        "SELECT created_at, outbox_message_id FROM outbox_messages "
        "ORDER BY created_at, outbox_message_id OFFSET $1 LIMIT 1",
        rows // 2,
    )
    transaction = db.transaction()
    await transaction.start()
    try:
        # As the store runs it (store.postgres._requeue_batch).
        await db.execute("SET LOCAL enable_sort = off; SET LOCAL enable_seqscan = off")
        raw = await db.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {QUERIES['requeue_failed']}",
            None,
            None,
            None,
            None,
            *middle,
            1000,
            None,
            None,
        )
    finally:
        await transaction.rollback()
    nodes = plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    assert [n["Node Type"] for n in nodes if "Sort" in n["Node Type"]] == []
    # The batch's 1,000 rows are the only ones its scans read (before: the 10,000 after them),
    # once in order and, on a plan that locks them by the same index, once more.
    examined = sum(
        n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
        for n in nodes
        if n.get("Relation Name", "").startswith("outbox_messages")
        and "Index Name" in n
        and not n["Index Name"].endswith("_pkey")
    )
    assert examined in (1000, 2000)

    report = await operations.requeue(db, operations.RequeueFilter(all_failed=True), dry_run=False)
    assert report.requeued == rows
    assert await statuses(db) == {"Pending": rows}
