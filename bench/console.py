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
migrated, with both dropped, with an index over every row, ``(created_at, id)``, in place of
the partial one, and with the backlog's index weighed (``BACKLOG_ORDER_INDEX``) added,
interleaved ``wal_runs`` times: WAL bytes per message of each.

The console in an incident (``measure_incident``, the ``console_calls`` section): seven days of
history (``history`` rows, one in ``failed_every`` Failed) and then ``pending`` rows (500,000)
created over the last two hours, still Pending (one in ten backing off after a 503, one in ten
parked behind its ordering key), the newest ``processing`` of them Processing; an attempt per
finished message and per message backing off, 200 recorded actions, two open breakers, a paused
endpoint. Every API call the console's page makes is asked through the functions' HTTP API as
``outbox serve`` hosts it (keyed, on a local port), once a round for ``rounds`` rounds: median,
p95, min and max of each; then the plan of each list call and of the overview's and the
detail's statements, ``EXPLAIN (ANALYZE, BUFFERS)``: its time, the most rows a sort in it took
in (the whole backlog, where a list sorts it) and what it read. A route this version does not
serve yet (``/api/outbox/endpoints``) is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit
from uuid import UUID

from bench.common import (
    SECRET,
    Database,
    ReceiverProcess,
    log,
    median,
    percentile,
    relay_settings,
)
from bench.dbcost import drain_with
from bench.scale import plan_nodes
from outbox.operations import views
from outbox.operations.list_query import MessageQuery, parse_message_query
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
    limit = query.limit + 1
    args = views.console_message_arguments(
        wanted, query.after, limit, views.scan_limit(wanted, limit)
    )
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
# And the one weighed for the backlog (the journal's 2026-12-07 sitting): Pending and Processing
# rows in the list's order, which would bound the backlog's pages as the partial indexes bound the
# finished rows'; a message takes an entry at its insert and at its lease.
BACKLOG_ORDER_INDEX = (
    "CREATE INDEX outbox_messages_backlog_order_idx ON outbox_messages "
    "(status, created_at, outbox_message_id) WHERE status IN ('Pending', 'Processing')"
)
WAL_ARMS: dict[str, dict[str, tuple[str, ...]]] = {
    "without": {"drop": CONSOLE_INDEXES, "create": ()},
    "with": {"drop": (), "create": ()},
    "every_row_instead": {"drop": (CREATED_INDEX,), "create": (EVERY_ROW_INDEX,)},
    "backlog_order_added": {"drop": (), "create": (BACKLOG_ORDER_INDEX,)},
}


async def measure_wal(
    receiver: ReceiverProcess, messages: int, runs: int, concurrency: int
) -> dict[str, Any]:
    """WAL per message (enqueued and delivered) with the console's indexes (as migrated),
    without them, with an index over every row in place of the partial one, and with the
    backlog's index weighed (``BACKLOG_ORDER_INDEX``) added."""
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
        # What the backlog's index would add to a message's life, as migrated.
        "backlog_order_ratio": round(total["backlog_order_added"] / total["with"], 3),
        "backlog_order_bytes": round(total["backlog_order_added"] - total["with"], 1),
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


# The console in an incident: every API call its page makes, over a backlog of Pending rows.

# Seven days of history before the incident (one row in $2 Failed, the others Processed), then the
# incident: $3 rows created over its two hours, still Pending (one in ten backing off after a 503,
# one in ten parked behind its ordering key), the newest $4 of them Processing.
INCIDENT_HISTORY = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, processed_at, last_error, ordering_key,
                             ordering_seq, created_at)
SELECT gen_random_uuid(), ($3::text[])[1 + g % 5],
       jsonb_build_object('orderId', g, 'customerId', 'cus_' || g % 9973, 'total', '19.99'),
       CASE WHEN g % $2 = 7 % $2 THEN 'Failed' ELSE 'Processed' END,
       CASE WHEN g % $2 = 7 % $2 THEN 10 ELSE 1 END,
       c.at, CASE WHEN g % $2 <> 7 % $2 THEN c.at + interval '50 ms' END,
       CASE WHEN g % $2 = 7 % $2 THEN
           (ARRAY['gave up after 10 attempts: HTTP 503 Service Unavailable',
                  'no endpoint configured for event type ''X''',
                  'HTTP 500: boom'])[1 + g % 3] END,
       CASE WHEN g % 5 = 1 THEN 'customer-' || g % 50000 END,
       CASE WHEN g % 5 = 1 THEN g END,
       c.at
FROM generate_series(1, $1) AS g,
     LATERAL (SELECT now() - interval '2 hours' - interval '7 days'
                     + (g::float8 / $1) * interval '7 days' AS at) AS c
"""
INCIDENT_BACKLOG = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, lease_expires_at, last_error, ordering_key,
                             ordering_seq, created_at)
SELECT gen_random_uuid(), ($3::text[])[1 + g % 5],
       jsonb_build_object('orderId', g, 'customerId', 'cus_' || g % 9973, 'total', '19.99'),
       CASE WHEN g > $1::int THEN 'Processing' ELSE 'Pending' END,
       CASE WHEN g > $1 OR g % 10 = 3 THEN 1 ELSE 0 END,
       CASE WHEN g > $1 THEN now() + interval '1 minute'
            WHEN g % 10 = 3 THEN now() + (g % 600) * interval '1 second'
            WHEN g % 10 = 6 THEN 'infinity'
            ELSE c.at END,
       CASE WHEN g > $1 THEN now() + interval '1 minute' END,
       CASE WHEN g <= $1 AND g % 10 = 3 THEN 'HTTP 503 Service Unavailable' END,
       CASE WHEN g % 5 = 1 THEN 'customer-' || g % 50000 END,
       CASE WHEN g % 5 = 1 THEN $4::bigint + g END,
       c.at
FROM generate_series(1, $1::int + $2::int) AS g,
     LATERAL (SELECT now() - interval '2 hours'
                     + (g::float8 / ($1::int + $2::int)) * interval '2 hours' AS at) AS c
"""
# One attempt per finished message and per Pending one backing off (its 503).
INCIDENT_ATTEMPTS = """
INSERT INTO outbox_attempts (outbox_message_id, endpoint, attempt_number, lease_token, started_at,
                             finished_at, duration_ms, outcome, applied, http_status, error)
SELECT outbox_message_id,
       CASE event_type WHEN 'OrderShipped' THEN 'shipping' WHEN 'InvoiceIssued' THEN 'billing'
                       WHEN 'CustomerUpdated' THEN 'crm' ELSE 'orders' END,
       attempt_count, outbox_message_id, created_at,
       created_at + interval '50 ms', 50,
       CASE WHEN status = 'Processed' THEN 'Processed'
            WHEN status = 'Failed' THEN 'Failed' ELSE 'Pending' END, true,
       CASE WHEN status = 'Processed' THEN 200 ELSE 503 END,
       CASE WHEN status <> 'Processed' THEN 'HTTP 503 Service Unavailable' END
FROM outbox_messages
WHERE status IN ('Processed', 'Failed') OR attempt_count > 0
"""
# What an operator did in the incident so far, and the breakers it opened.
INCIDENT_STATE = (
    """INSERT INTO outbox_console_actions (action_id, action, filter, affected, dry_run, actor,
                                           created_at)
       SELECT 'bench-' || a, (ARRAY['requeue', 'pause', 'resume', 'resend'])[1 + a % 4],
              '{"event_type": "OrderShipped"}', a % 50, a % 2 = 0, 'key:0123456789ab',
              now() - a * interval '10 minutes'
       FROM generate_series(1, 200) AS a""",
    """INSERT INTO outbox_endpoints (event_type, endpoint, consecutive_failures, opens, opened_at,
                                     reopen_at)
       VALUES ('OrderShipped', 'shipping', 40, 3, now() - interval '30 minutes',
               now() + interval '2 minutes'),
              ('InvoiceIssued', 'billing', 12, 1, now() - interval '20 minutes',
               now() - interval '1 minute')""",
    """INSERT INTO outbox_paused_endpoints (event_type, endpoint, paused_by)
       VALUES ('CustomerUpdated', 'crm', 'key:0123456789ab')""",
)
API_KEY = "bench-console-key-0123456789"
MESSAGES = "outbox/messages"


def add_incident_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--console-pending", type=int, default=500_000, help="Pending rows, console API calls")
    add("--console-processing", type=int, default=256, help="Processing rows beside them")
    add("--console-history", type=int, default=200_000, help="finished rows before them")
    add("--console-failed-every", type=int, default=20, help="one history row in N Failed")
    add("--console-call-rounds", type=int, default=20, help="rounds of every API call (p95)")


async def fill_incident(
    conn: Any, *, pending: int, processing: int, history: int, failed_every: int
) -> dict[str, float]:
    """The table as an incident leaves it (above), vacuumed and analysed."""
    started = time.perf_counter()
    await conn.execute(INCIDENT_HISTORY, history, failed_every, list(EVENT_TYPES))
    await conn.execute(INCIDENT_BACKLOG, pending, processing, list(EVENT_TYPES), history)
    filled = time.perf_counter()
    await conn.execute(INCIDENT_ATTEMPTS)
    for statement in INCIDENT_STATE:
        await conn.execute(statement)
    attempts = time.perf_counter()
    await conn.execute("VACUUM ANALYZE")
    done = time.perf_counter()
    seconds = {
        "fill_messages_s": round(filled - started, 1),
        "fill_attempts_s": round(attempts - filled, 1),
        "vacuum_analyze_s": round(done - attempts, 1),
    }
    log(f"console calls: {pending:,} Pending, {history:,} finished, filled {seconds}")
    return seconds


def incident_calls(samples: dict[str, str], window: tuple[str, str]) -> dict[str, str]:
    """Each API call measured, by name: its path under ``/api/`` (cursors added later)."""
    window_query = urlencode({"created_from": window[0], "created_to": window[1]})
    return {
        "page (HTML)": "outbox/console",
        "overview": "outbox/overview",
        "status": "outbox/status",
        "list, no filter": "outbox/messages",
        "list, status=Pending": "outbox/messages?status=Pending",
        "list, status=Processing": "outbox/messages?status=Processing",
        "list, status=Processed": "outbox/messages?status=Processed",
        "list, status=Failed": "outbox/messages?status=Failed",
        "list, event_type": "outbox/messages?event_type=OrderShipped",
        "list, status=Pending + event_type": (
            "outbox/messages?status=Pending&event_type=OrderShipped"
        ),
        "list, created window (10 min)": f"outbox/messages?{window_query}",
        "detail, Pending (backing off)": f"outbox/messages/{samples['pending']}",
        "detail, Failed": f"outbox/messages/{samples['failed']}",
        "actions": "outbox/actions",
        "endpoints": "outbox/endpoints",
    }


# The pages after the first, by the cursor the first gave: (name, first page's call).
NEXT_PAGES = {
    "list, next page (no filter)": "list, no filter",
    "list, next page (status=Pending)": "list, status=Pending",
    "list, next page (created window)": "list, created window (10 min)",
}


async def incident_samples(conn: Any) -> tuple[dict[str, str], tuple[str, str]]:
    """A message of each kind the detail is asked for, and a window inside the incident."""
    pending = await conn.fetchval(
        "SELECT outbox_message_id FROM outbox_messages "
        "WHERE status = 'Pending' AND attempt_count > 0 LIMIT 1"
    )
    failed = await conn.fetchval(
        "SELECT outbox_message_id FROM outbox_messages WHERE status = 'Failed' LIMIT 1"
    )
    now = await conn.fetchval("SELECT now()")
    window = (now - timedelta(minutes=70), now - timedelta(minutes=60))
    return {"pending": str(pending), "failed": str(failed)}, (
        window[0].astimezone(UTC).isoformat().replace("+00:00", "Z"),
        window[1].astimezone(UTC).isoformat().replace("+00:00", "Z"),
    )


class ConsoleServer:
    """The functions' HTTP API as ``outbox serve`` hosts it, on a free local port, with the
    relay's settings naming the incident's endpoints."""

    def __init__(self, database_url: str, hook_url: str) -> None:
        from outbox.azure.host import functions_host

        webhooks = {
            event_type: [
                {"name": name, "url": hook_url, "secret": SECRET} for name in ENDPOINTS[event_type]
            ]
            for event_type in EVENT_TYPES
        }
        functions_host.use(relay_settings(database_url, hook_url, 16, webhooks=webhooks))
        self.url = ""
        self._runner: Any = None

    async def __aenter__(self) -> ConsoleServer:
        from aiohttp import web

        from outbox.azure import functions
        from outbox.hosting.serve import http_app, index

        bindings = [b for b in index(functions.app()) if b.trigger["type"] == "httpTrigger"]
        self._runner = web.AppRunner(http_app(bindings, API_KEY), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/api/"
        return self

    async def __aexit__(self, *_: object) -> None:
        from outbox.azure.host import functions_host

        await self._runner.cleanup()
        await functions_host.close()


async def call_once(session: Any, url: str) -> tuple[float, int, Any]:
    """One call: its milliseconds (to the last byte of the answer), status and JSON body."""
    started = time.perf_counter()
    async with session.get(url, headers={"x-functions-key": API_KEY}) as response:
        raw = await response.read()
    elapsed = 1000 * (time.perf_counter() - started)
    is_json = response.content_type == "application/json"
    return elapsed, response.status, json.loads(raw) if is_json else None


async def time_api_calls(
    session: Any, base: str, calls: dict[str, str], rounds: int
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Every call once a round, in the same order, ``rounds`` times; the first answer of each."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    answers: dict[str, Any] = {}
    for _ in range(rounds):
        for name, path in calls.items():
            elapsed, status, body = await call_once(session, base + path)
            # status answers 503 while the backlog is older than its alert threshold.
            unhealthy = status == 503 and isinstance(body, dict) and body.get("healthy") is False
            if status != 200 and not unhealthy:
                raise AssertionError(f"console call {name} ({path}) answered {status}: {body}")
            timings[name].append(elapsed)
            answers.setdefault(name, body)
    return timings, answers


def _call_summary(timings: list[float]) -> dict[str, Any]:
    return {
        "ms_median": round(median(timings), 1),
        "ms_p95": round(percentile(timings, 95), 1),
        "ms_min": round(min(timings), 1),
        "ms_max": round(max(timings), 1),
    }


def plan_figures(explained: Any) -> dict[str, Any]:
    """From an ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` document: its execution time, the most
    rows any sort took in (the whole backlog, when a branch sorts it), the buffers it touched and
    the indexes and tables it read."""
    document = json.loads(explained) if isinstance(explained, str) else explained
    top = document[0]
    plan = top["Plan"]
    nodes = list(plan_nodes(plan))
    sorted_rows = [
        int(sum(c["Actual Rows"] * c["Actual Loops"] for c in node.get("Plans", [])))
        for node in nodes
        if node["Node Type"] in ("Sort", "Incremental Sort")
    ]
    scanned = sorted(
        {node.get("Index Name") or node.get("Relation Name", "") for node in nodes} - {""}
    )
    return {
        "ms": round(top["Execution Time"], 1),
        "sorted_rows": max(sorted_rows, default=0),
        "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
        "reads": scanned,
    }


async def explain_analyze(conn: Any, statement: str, *args: Any) -> dict[str, Any]:
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        text = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", *args)
    return plan_figures(text)


async def list_plan(conn: Any, path: str) -> dict[str, Any]:
    """The plan of the list's statement for one call's query string."""
    query = parse_message_query(dict(parse_qsl(urlsplit(path).query)))
    wanted = views.message_filter(query, ENDPOINTS)
    limit = query.limit + 1
    args = views.console_message_arguments(
        wanted, query.after, limit, views.scan_limit(wanted, limit)
    )
    return await explain_analyze(conn, views.console_statement(), *args)


async def statement_plans(conn: Any, samples: dict[str, str]) -> dict[str, Any]:
    """The overview's and the detail's statements, each alone."""
    pending = UUID(samples["pending"])
    named: dict[str, tuple[str, tuple[Any, ...]]] = {
        "backlog_status (overview)": ("backlog_status", (views.PROCESSED_COUNTED,)),
        "backlog_status (status: every row)": ("backlog_status", (None,)),
        "console_rates": ("console_rates", ()),
        "console_failure_reasons": ("console_failure_reasons", (views.FAILED_SAMPLE,)),
        "console_held_keys": ("console_held_keys", ()),
        "open_breakers": ("open_breakers", ()),
        "show_message": ("show_message", (pending,)),
        "show_attempts": ("show_attempts", (pending,)),
    }
    plans = {}
    for label, (name, args) in named.items():
        plans[label] = await explain_analyze(conn, QUERIES[name], *args)
    return plans


async def measure_incident(
    receiver: ReceiverProcess,
    *,
    pending: int,
    processing: int,
    history: int,
    failed_every: int,
    rounds: int,
) -> dict[str, Any]:
    """Every API call the console's page makes, over the incident's table, ``rounds`` times
    each (round by round, in the same order), through the functions' HTTP API as ``serve``
    hosts it; and the plan of each list call and of the overview's and detail's statements."""
    import aiohttp

    async with Database("console_calls") as db:
        await db.migrate()
        conn = await db.connect()
        try:
            timing = await fill_incident(
                conn,
                pending=pending,
                processing=processing,
                history=history,
                failed_every=failed_every,
            )
            counts = dict(
                await conn.fetch("SELECT status, count(*) FROM outbox_messages GROUP BY 1")
            )
            samples, window = await incident_samples(conn)
            calls = incident_calls(samples, window)
            async with (
                ConsoleServer(db.url, receiver.url("/hook")) as server,
                aiohttp.ClientSession() as session,
            ):
                skipped = await _missing_routes(session, server.url, calls)
                for name in skipped:
                    calls.pop(name)
                calls.update(await _next_pages(session, server.url, calls))
                timings, answers = await time_api_calls(session, server.url, calls, rounds)
            listed = {n: path for n, path in calls.items() if urlsplit(path).path == MESSAGES}
            plans = {name: await list_plan(conn, path) for name, path in listed.items()}
            plans.update(await statement_plans(conn, samples))
        finally:
            await conn.close()
    figures = {}
    for name, spent in timings.items():
        figures[name] = _call_summary(spent)
        if name in listed:
            figures[name]["rows"] = len(answers[name]["messages"])
            figures[name]["scan_limited"] = answers[name]["scan_limited"]
        log(f"console call {name}: {figures[name]}")
    slowest = max(figures, key=lambda name: figures[name]["ms_median"])
    return {
        "pending": pending,
        "processing": processing,
        "history": history,
        "counts": counts,
        "rounds": rounds,
        "fill": timing,
        "calls": figures,
        "skipped": skipped,
        "slowest": slowest,
        "plans": plans,
        "estimated_counts": answers["overview"]["estimated_counts"],
    }


async def _missing_routes(session: Any, base: str, calls: dict[str, str]) -> dict[str, str]:
    """The calls whose route this version of the API does not serve (the endpoints route, until
    it lands), each with a note; printed, then skipped."""
    missing = {}
    for name, path in calls.items():
        _, status, body = await call_once(session, base + path)
        if status == 404 and "no such route" in str((body or {}).get("error", "")):
            missing[name] = f"GET /api/{path} is not served by this version: skipped"
            log(f"console call {name}: {missing[name]}")
    return missing


async def _next_pages(session: Any, base: str, calls: dict[str, str]) -> dict[str, str]:
    """The page after the first of some lists, by the cursor their first page gave."""
    following = {}
    for name, first in NEXT_PAGES.items():
        _, _, body = await call_once(session, base + calls[first])
        if body["next"] is not None:
            joiner = "&" if "?" in calls[first] else "?"
            following[name] = calls[first] + joiner + urlencode({"after": body["next"]})
    return following
