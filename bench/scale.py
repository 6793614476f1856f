"""Scale: the lease statement with few and with many finished rows in the table, and with many
rows waiting behind held ordering keys.

The same database grows from ``small`` Processed rows to ``large`` Processed plus ``failed``
Failed rows (written with ``generate_series``, as years of traffic would leave them), always
with the same ``pending`` due rows. At each size the lease statement (``lease_batch``, batch of
100) runs ``repeats`` times, each in a transaction that is rolled back so every run leases the
same rows; its plan is captured with ``EXPLAIN (FORMAT JSON)``.

Held keys: ``held_keys`` ordering keys whose first message is Failed (the default ``hold``
keeps the rest waiting) with ``held_behind`` Pending messages behind each, beside the same
``pending`` due rows: the lease is timed without them and with them, parked as the relay leaves
them. Separately, how long leases take to park such rows the first time (a backlog no relay had
seen, e.g. after an upgrade) is timed on a fraction of them. And how soon other messages are
leased beside such a backlog (``held_backlog`` rows behind ``held_backlog_keys`` keys).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from bench.common import Database, log, median
from outbox.core.settings import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.store.postgres import lease_statement

DUE_INDEX = "outbox_messages_due_idx"
BATCH_SIZE = 100
LEASE_SECONDS = 60.0
# The lease statement as the processor runs it by default (its batch size written in), and its
# parameters: lease, a Failed message holds its ordering key, the payload size limit.
LEASE = lease_statement(BATCH_SIZE)
LEASE_ARGUMENTS = (LEASE_SECONDS, True, DEFAULT_MAX_PAYLOAD_BYTES)

FILL = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             next_attempt_at, processed_at, last_error, created_at)
SELECT gen_random_uuid(), 'OrderPlaced', jsonb_build_object('orderId', g, 'total', '19.99'),
       $2, CASE WHEN $2 = 'Failed' THEN 10 WHEN $2 = 'Pending' THEN 0 ELSE 1 END,
       now() - interval '30 days' + g * interval '1 ms',
       CASE WHEN $2 = 'Processed' THEN now() - interval '30 days' + g * interval '1 ms' END,
       CASE WHEN $2 = 'Failed' THEN 'gave up after 10 attempts: HTTP 500' END,
       now() - interval '31 days' + g * interval '1 ms'
FROM generate_series(1, $1) AS g
"""


async def fill(conn: Any, count: int, status: str) -> None:
    if count > 0:
        await conn.execute(FILL, count, status)


def plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, depth first."""
    yield plan
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


def scans(explained: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(node type, relation, index)`` of every scan in an EXPLAIN JSON document."""
    return [
        (node["Node Type"], node.get("Relation Name", ""), node.get("Index Name", ""))
        for node in plan_nodes(explained[0]["Plan"])
        if "Scan" in node["Node Type"]
    ]


async def explain(conn: Any, *, analyze: bool = False) -> list[dict[str, Any]]:
    options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    tx = conn.transaction()
    await tx.start()
    try:
        text = await conn.fetchval(f"EXPLAIN ({options}) {LEASE}", *LEASE_ARGUMENTS)
    finally:
        await tx.rollback()
    document: list[dict[str, Any]] = json.loads(text) if isinstance(text, str) else text
    return document


async def time_lease(conn: Any, repeats: int) -> list[float]:
    """Milliseconds per lease statement (round trip included), each run rolled back."""
    timings = []
    for _ in range(repeats):
        tx = conn.transaction()
        await tx.start()
        try:
            started = time.perf_counter()
            rows = await conn.fetch(LEASE, *LEASE_ARGUMENTS)
            timings.append(1000 * (time.perf_counter() - started))
        finally:
            await tx.rollback()
        if len(rows) != BATCH_SIZE:
            raise AssertionError(f"scale: the lease returned {len(rows)} rows, not {BATCH_SIZE}")
    return timings


async def measure_size(
    conn: Any, label: str, repeats: int, *, must_not_scan_table: bool
) -> dict[str, Any]:
    await conn.execute("VACUUM ANALYZE outbox_messages")
    counts = {
        row["status"]: row["n"]
        for row in await conn.fetch(
            "SELECT status, count(*) AS n FROM outbox_messages GROUP BY status"
        )
    }
    plan = await explain(conn)
    used = scans(plan)
    if not any(index == DUE_INDEX for _, _, index in used):
        raise AssertionError(f"scale ({label}): the lease does not use {DUE_INDEX}: {used}")
    # On a small table joining the leased ids back by a sequential scan is the cheaper plan;
    # on a large one it would read every finished row.
    if must_not_scan_table and ("Seq Scan", "outbox_messages", "") in used:
        raise AssertionError(f"scale ({label}): the lease reads the whole table: {used}")
    analyzed = await explain(conn, analyze=True)
    timings = await time_lease(conn, repeats)
    result = {
        "label": label,
        "rows": counts,
        "lease_ms_median": round(median(timings), 3),
        "lease_ms_runs": [round(t, 3) for t in timings],
        "execution_ms": analyzed[0]["Execution Time"],
        "scans": [list(scan) for scan in used],
        "plan": plan,
    }
    log(f"scale {label}: lease {result['lease_ms_median']:.2f} ms (median of {repeats}) {counts}")
    return result


async def measure(
    *, small: int, large: int, failed: int, pending: int, repeats: int
) -> dict[str, Any]:
    async with Database("scale") as db:
        await db.migrate()
        conn = await db.connect()
        try:
            await fill(conn, pending, "Pending")
            await fill(conn, small, "Processed")
            few = await measure_size(
                conn, f"{small:,} Processed", repeats, must_not_scan_table=False
            )
            await fill(conn, large - small, "Processed")
            await fill(conn, failed, "Failed")
            many = await measure_size(
                conn,
                f"{large:,} Processed + {failed:,} Failed",
                repeats,
                must_not_scan_table=True,
            )
        finally:
            await conn.close()
    return {
        "pending": pending,
        "batch_size": BATCH_SIZE,
        "small": few,
        "large": many,
        "ratio": round(many["lease_ms_median"] / few["lease_ms_median"], 2),
    }


# Older than the due rows of FILL: a lease meets them first, as it meets a key held for long.
HELD = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, attempt_count,
                             last_error, ordering_key, ordering_seq, created_at, next_attempt_at)
SELECT gen_random_uuid(), 'OrderPlaced', jsonb_build_object('orderId', k, 'n', n),
       CASE WHEN n = 0 THEN 'Failed' ELSE 'Pending' END, CASE WHEN n = 0 THEN 10 ELSE 0 END,
       CASE WHEN n = 0 THEN 'gave up after 10 attempts: HTTP 500' END, $3 || k,
       nextval('outbox_messages_ordering_seq'), now() - interval '60 days',
       now() - interval '60 days'
FROM (SELECT k, n FROM generate_series(1, $1) AS k, generate_series(0, $2) AS n
      ORDER BY n, k) AS rows
"""
# What the lease leaves behind a held key: next_attempt_at past the end of every due scan.
PARK = "UPDATE outbox_messages SET next_attempt_at = 'infinity' WHERE ordering_key LIKE $1"
SET_ASIDE = (
    "UPDATE outbox_messages SET next_attempt_at = next_attempt_at + make_interval(days => $1) "
    "WHERE ordering_key IS NULL"
)


async def time_parking(conn: Any, keys: int, behind: int) -> dict[str, Any]:
    """Leases until ``keys`` times ``behind`` never-seen rows behind held keys are all parked (the
    unkeyed due rows are set aside meanwhile, 60 days ahead: each lease meets only those)."""
    await conn.execute(HELD, keys, behind, "fresh-")
    await conn.execute(SET_ASIDE, 60)
    await conn.execute("ANALYZE outbox_messages")
    leases, started = 0, time.perf_counter()
    while await conn.fetch(LEASE, *LEASE_ARGUMENTS):
        leases += 1
    seconds = time.perf_counter() - started
    await conn.execute(SET_ASIDE, -60)
    return {"rows": keys * behind, "leases": leases, "seconds": round(seconds, 3)}


OTHERS = """
INSERT INTO outbox_messages (outbox_message_id, event_type, payload, ordering_key, ordering_seq)
SELECT gen_random_uuid(), 'OrderPlaced', jsonb_build_object('other', g),
       CASE WHEN $2 THEN 'other-' || g END,
       CASE WHEN $2 THEN nextval('outbox_messages_ordering_seq') END
FROM generate_series(1, $1) AS g
"""


async def time_to_others(conn: Any, keys: int, behind: int, others: int) -> dict[str, Any]:
    """A backlog no relay has seen, ``keys`` times ``behind`` rows behind held keys, older than
    ``others`` due messages without a key and as many of other keys: committed leases, as a
    drain runs them, until every other message is leased. Seconds and leases until the first
    of them is leased, and until the last of each kind."""
    await conn.execute("DELETE FROM outbox_messages")
    await conn.execute(HELD, keys, behind, "backlog-")
    await conn.execute(OTHERS, others, False)
    await conn.execute(OTHERS, others, True)
    await conn.execute("VACUUM ANALYZE outbox_messages")
    seen: dict[str, float | int] = {}
    unkeyed = keyed = leases = 0
    started = time.perf_counter()
    while unkeyed < others or keyed < others:
        rows = await conn.fetch(LEASE, *LEASE_ARGUMENTS)
        leases += 1
        leased = [row for row in rows if row["lease_token"] is not None]
        if not rows:
            raise AssertionError("scale: a lease found nothing before every other message")
        unkeyed += sum(row["ordering_key"] is None for row in leased)
        keyed += sum(row["ordering_key"] is not None for row in leased)
        now = round(time.perf_counter() - started, 3)
        for name, done in (
            ("first", unkeyed + keyed > 0),
            ("all_unkeyed", unkeyed >= others),
            ("all_keyed", keyed >= others),
        ):
            if done and name not in seen:
                seen[f"{name}_seconds"], seen[f"{name}_leases"] = now, leases
                seen[name] = True
    result = {k: v for k, v in seen.items() if not isinstance(v, bool)}
    result |= {"rows": keys * behind, "keys": keys, "others": others}
    log(f"scale held backlog: others leased {result}")
    return result


async def measure_held(
    *,
    keys: int,
    behind: int,
    pending: int,
    repeats: int,
    fresh_keys: int,
    backlog_keys: int = 1,
    backlog: int = 1_000_000,
) -> dict[str, Any]:
    async with Database("held") as db:
        await db.migrate()
        conn = await db.connect()
        try:
            await fill(conn, pending, "Pending")
            without = await measure_size(
                conn, f"{pending:,} due, no held keys", repeats, must_not_scan_table=False
            )
            await conn.execute(HELD, keys, behind, "held-")
            await conn.execute(PARK, "held-%")
            held = await measure_size(
                conn,
                f"{pending:,} due + {keys * behind:,} behind {keys:,} held keys",
                repeats,
                must_not_scan_table=True,
            )
            parking = await time_parking(conn, fresh_keys, behind)
            others = await time_to_others(conn, backlog_keys, backlog // backlog_keys, 100)
        finally:
            await conn.close()
    log(f"scale held keys: parking {parking}")
    return {
        "keys": keys,
        "behind": behind,
        "without": without,
        "with": held,
        "ratio": round(held["lease_ms_median"] / without["lease_ms_median"], 2),
        "first_parking": parking,
        "others_beside_backlog": others,
    }
