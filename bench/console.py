"""The console at scale: the first page of each of the message list's filters and the overview,
over a table of ``rows`` messages (10M in the full run), and the WAL each delivered message costs
with and without the indexes the console reads (``outbox_messages_created_idx``, and
``outbox_attempts_finished_idx`` for its rates).

The table is filled once, in one ``INSERT … SELECT generate_series`` (then one for the attempt
history, one attempt per finished message), as months of traffic would leave it: mostly
Processed, 1% Failed, a backlog of 0.6% at the head (0.5% Pending, 0.1% Processing); five event
types; a fifth of the messages with one of 50,000 ordering keys; created over 30 days. Then
``VACUUM ANALYZE``. Each filter's first page is asked ``repeats`` times through the console's own
code (``views.list_messages``) and its plan captured with ``EXPLAIN``: which indexes it reads,
and whether it reads the table whole (it must not). The overview likewise, and each of its
statements alone.

WAL: the same backlog enqueued and drained by the relay (``bench.dbcost``) with the schema as
migrated, with both dropped, and with an index over every row, ``(created_at, id)``, in place of
the partial one, interleaved ``wal_runs`` times: WAL bytes per message of each.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bench.common import Database, ReceiverProcess, log, median
from bench.dbcost import drain_with
from bench.scale import plan_nodes
from outbox.operations import views
from outbox.operations.list_query import MessageQuery
from outbox.operations.sql import QUERIES, row

EVENT_TYPES = ("OrderPlaced", "OrderPaid", "OrderShipped", "InvoiceIssued", "CustomerUpdated")
ENDPOINTS = {
    "OrderPlaced": ("orders", "audit"),
    "OrderPaid": ("orders",),
    "OrderShipped": ("shipping",),
    "InvoiceIssued": ("billing",),
    "CustomerUpdated": ("crm",),
}
CREATED_INDEX = "outbox_messages_processed_order_idx"
# The indexes the console's scale added (migrations 0017, 0018): what the WAL runs weigh.
CONSOLE_INDEXES = (CREATED_INDEX, "outbox_attempts_finished_idx")

# The newest 0.6 % are under way (a backlog at the head of the table: one in six Processing, the
# rest Pending); before them, one row in a hundred Failed, every other Processed.
FILL = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, lease_expires_at, processed_at, last_error,
                             ordering_key, ordering_seq, created_at)
SELECT gen_random_uuid(), ($2::text[])[1 + g % 5],
       jsonb_build_object('orderId', g, 'customerId', 'cus_' || g % 9973, 'total', '19.99'),
       s.status,
       CASE s.status WHEN 'Failed' THEN 10 WHEN 'Pending' THEN 0 ELSE 1 END,
       c.at, CASE WHEN s.status = 'Processing' THEN c.at + interval '1 minute' END,
       CASE WHEN s.status = 'Processed' THEN c.at + interval '50 ms' END,
       CASE WHEN s.status = 'Failed' THEN
           (ARRAY['gave up after 10 attempts: HTTP 503 Service Unavailable',
                  'no endpoint configured for event type ''X''',
                  'HTTP 500: boom'])[1 + g % 3] END,
       CASE WHEN g % 5 = 1 THEN 'customer-' || g % 50000 END,
       CASE WHEN g % 5 = 1 THEN g END,
       c.at
FROM generate_series(1, $1) AS g,
     LATERAL (SELECT now() - interval '30 days' + (g::float8 / $1) * interval '30 days' AS at) c,
     LATERAL (SELECT CASE WHEN g > $1 - $1 * 6 / 1000
                          THEN CASE WHEN g % 6 = 0 THEN 'Processing' ELSE 'Pending' END
                          WHEN g % 100 = 7 THEN 'Failed'
                          ELSE 'Processed' END AS status) s
"""
ATTEMPTS = """
INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, started_at,
                             finished_at, duration_ms, outcome, applied, http_status, error)
SELECT outbox_message_id, 1, outbox_message_id, created_at, created_at + interval '50 ms', 50,
       CASE WHEN status = 'Processed' THEN 'Processed' ELSE 'Failed' END, true,
       CASE WHEN status = 'Processed' THEN 200 ELSE 503 END,
       CASE WHEN status <> 'Processed' THEN 'HTTP 503' END
FROM outbox_messages
WHERE status IN ('Processed', 'Failed')
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--console-rows", type=int, default=10_000_000, help="messages in the console's table")
    add("--console-repeats", type=int, default=7, help="calls per console figure (median)")
    add("--console-wal-messages", type=int, default=20_000, help="per WAL run, console indexes")
    add("--console-wal-runs", type=int, default=3)


def filters(rows: int) -> dict[str, dict[str, Any]]:
    """Each filter measured, by name: the query's fields."""
    from datetime import UTC, datetime, timedelta

    middle = datetime.now(UTC) - timedelta(days=15)
    return {
        "none": {},
        "status=Pending": {"status": "Pending"},
        "status=Processing": {"status": "Processing"},
        "status=Processed": {"status": "Processed"},
        "status=Failed": {"status": "Failed"},
        "event_type": {"event_type": "OrderShipped"},
        "event_type (none match)": {"event_type": "NeverSent"},
        "ordering_key": {"ordering_key": f"customer-{(rows - 4) % 50000}"},
        "endpoint": {"endpoint": "shipping"},
        "time range (1 h)": {"created_from": middle, "created_to": middle + timedelta(hours=1)},
        "error text": {"error": "HTTP 503"},
        "status=Failed + error text": {"status": "Failed", "error": "no endpoint"},
    }


def scan_nodes(explained: Any) -> list[list[str]]:
    document = json.loads(explained) if isinstance(explained, str) else explained
    return [
        [node["Node Type"], node.get("Relation Name", ""), node.get("Index Name", "")]
        for node in plan_nodes(document[0]["Plan"])
        if "Scan" in node["Node Type"]
    ]


async def explain_list(conn: Any, query: MessageQuery) -> list[list[str]]:
    wanted = views.message_filter(query, ENDPOINTS)
    args = views.console_message_arguments(wanted, query.after, query.limit + 1)
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        text = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {views.console_statement()}", *args)
    return scan_nodes(text)


async def time_calls(repeats: int, call: Any) -> tuple[list[float], Any]:
    timings, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = await call()
        timings.append(1000 * (time.perf_counter() - started))
    return timings, result


def _summary(timings: list[float]) -> dict[str, Any]:
    return {
        "ms_median": round(median(timings), 2),
        "ms_min": round(min(timings), 2),
        "ms_max": round(max(timings), 2),
    }


async def measure_filters(conn: Any, rows: int, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, fields in filters(rows).items():
        query = MessageQuery(**fields)
        timings, page = await time_calls(
            repeats, lambda q=query: views.list_messages(conn, q, ENDPOINTS)
        )
        used = await explain_list(conn, query)
        # On a table a few times the scan limit, reading it whole is the cheaper plan.
        if rows >= 10 * views.CONSOLE_SCAN_LIMIT and ["Seq Scan", "outbox_messages", ""] in used:
            raise AssertionError(f"console ({name}): the list reads the whole table: {used}")
        results[name] = _summary(timings) | {
            "rows": len(page["messages"]),
            "bounded": page.get("scan_limited", False),
            "scans": used,
        }
        shown = len(page["messages"])
        log(f"console list {name}: {results[name]['ms_median']:.1f} ms, {shown} rows")
    return results


async def measure_overview(conn: Any, repeats: int) -> dict[str, Any]:
    """The overview through the console's code, and each of its statements alone."""
    timings, shown = await time_calls(repeats, lambda: views.overview(conn, 3600.0, ENDPOINTS))
    parts = {
        f"backlog_status (Processed counted up to {views.PROCESSED_COUNTED:,})": lambda: row(
            conn, "backlog_status", views.PROCESSED_COUNTED
        ),
        "backlog_status (every row counted, as `status`)": lambda: row(
            conn, "backlog_status", None
        ),
        "console_rates": lambda: conn.fetch(QUERIES["console_rates"]),
        "console_failure_reasons": lambda: conn.fetch(
            QUERIES["console_failure_reasons"], views.FAILED_SAMPLE
        ),
        "console_held_keys": lambda: conn.fetch(QUERIES["console_held_keys"]),
    }
    each = {}
    for name, call in parts.items():
        part_timings, _ = await time_calls(repeats, call)
        each[name] = _summary(part_timings)
    log(f"console overview: {median(timings):.1f} ms, counts {shown['counts']}, parts {each}")
    return _summary(timings) | {
        "counts": shown["counts"],
        "estimated": shown["estimated_counts"],
        "parts": each,
    }


async def fill(conn: Any, rows: int) -> dict[str, float]:
    started = time.perf_counter()
    await conn.execute(FILL, rows, list(EVENT_TYPES))
    filled = time.perf_counter()
    await conn.execute(ATTEMPTS)
    attempts = time.perf_counter()
    await conn.execute("VACUUM ANALYZE outbox_messages")
    await conn.execute("VACUUM ANALYZE outbox_attempts")
    done = time.perf_counter()
    seconds = {
        "fill_messages_s": round(filled - started, 1),
        "fill_attempts_s": round(attempts - filled, 1),
        "vacuum_analyze_s": round(done - attempts, 1),
    }
    log(f"console: {rows:,} rows filled {seconds}")
    return seconds


# The alternative weighed: one index over every row in the list's order.
EVERY_ROW_INDEX = (
    "CREATE INDEX outbox_messages_created_idx ON outbox_messages (created_at, outbox_message_id)"
)
WAL_ARMS: dict[str, dict[str, tuple[str, ...]]] = {
    "without": {"drop": CONSOLE_INDEXES, "create": ()},
    "with": {"drop": (), "create": ()},
    "every_row_instead": {"drop": (CREATED_INDEX,), "create": (EVERY_ROW_INDEX,)},
}


async def measure_wal(
    receiver: ReceiverProcess, messages: int, runs: int, concurrency: int
) -> dict[str, Any]:
    """WAL per message (enqueued and delivered) with the console's indexes (as migrated),
    without them, and with an index over every row in place of the partial one."""
    drained: dict[str, list[float]] = {arm: [] for arm in WAL_ARMS}
    enqueued: dict[str, list[float]] = {arm: [] for arm in WAL_ARMS}
    for n in range(1, runs + 1):
        for arm, change in WAL_ARMS.items():
            result = await drain_with(
                receiver,
                messages,
                concurrency=concurrency,
                drop_indexes=change["drop"],
                create_indexes=change["create"],
            )
            drained[arm].append(result["wal_bytes_per_message"])
            enqueued[arm].append(result["enqueue_wal_bytes_per_message"])
            log(
                f"console WAL run {n} {arm}: drain {result['wal_bytes_per_message']} B/msg, "
                f"enqueue {result['enqueue_wal_bytes_per_message']} B/msg"
            )
    total = {arm: median(drained[arm]) + median(enqueued[arm]) for arm in WAL_ARMS}
    return {
        "messages": messages,
        "drain_wal_bytes_per_message": drained,
        "enqueue_wal_bytes_per_message": enqueued,
        # Enqueue and delivery together, per message: what an index adds to a message's life.
        "median_total": total,
        "ratio": round(total["with"] / total["without"], 3),
        "every_row_ratio": round(total["every_row_instead"] / total["without"], 3),
    }


async def measure(
    receiver: ReceiverProcess,
    *,
    rows: int,
    repeats: int,
    wal_messages: int,
    wal_runs: int,
    concurrency: int,
) -> dict[str, Any]:
    async with Database("console") as db:
        await db.migrate()
        conn = await db.connect()
        try:
            timing = await fill(conn, rows)
            counts = dict(
                await conn.fetch("SELECT status, count(*) FROM outbox_messages GROUP BY 1")
            )
            listed = await measure_filters(conn, rows, repeats)
            shown = await measure_overview(conn, repeats)
        finally:
            await conn.close()
    wal = await measure_wal(receiver, wal_messages, wal_runs, concurrency)
    return {
        "rows": rows,
        "counts": counts,
        "repeats": repeats,
        "scan_limit": views.CONSOLE_SCAN_LIMIT,
        "fill": timing,
        "list": listed,
        "overview": shown,
        "wal": wal,
    }
