"""The exact count at the end of a run: every committed message against every arrival.

The harness's ``jobs_lost`` is ``enqueued - completed`` integrated from the sampled rates, an
estimate that shows a few "lost" jobs where none were. This count is not estimated: the messages
are the rows of ``outbox_messages`` (only committed rows are there, so a transaction whose COMMIT
failed counts only if it did commit), and the arrivals are the lines of every replica's ledger
(``bench.chaos.arrivals``), loaded into a temporary table so that PostgreSQL does the joins,
however long the run.

- **lost**: a committed message with no arrival anywhere, after the drain;
- **duplicate deliveries**: arrivals beyond the first of a message, each listed with its arrival
  times and the replicas whose relays sent them, for ``bench.chaos.report`` to explain;
- **unknown arrivals**: arrivals of ids that are not in the table (there should be none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

# How many lost messages and duplicated ones are listed (all are counted).
LISTED = 10_000

LOAD = """
CREATE TEMPORARY TABLE chaos_arrivals (
    arrived float8 NOT NULL,
    message_id uuid NOT NULL,
    enqueued float8 NOT NULL,
    source text NOT NULL
)
"""
STATUSES = "SELECT status, count(*) AS messages FROM outbox_messages GROUP BY status"
DELIVERED = "SELECT count(DISTINCT message_id) AS unique, count(*) AS arrivals FROM chaos_arrivals"
LOST = """
SELECT m.outbox_message_id::text AS id, m.status, (m.payload->>'enqueuedAt')::float8 AS enqueued
FROM outbox_messages AS m
WHERE NOT EXISTS (SELECT FROM chaos_arrivals AS a WHERE a.message_id = m.outbox_message_id)
ORDER BY enqueued
"""
DUPLICATED = """
SELECT message_id::text AS id, array_agg(arrived ORDER BY arrived) AS arrived,
       array_agg(source ORDER BY arrived) AS sources
FROM chaos_arrivals
GROUP BY message_id
HAVING count(*) > 1
ORDER BY min(arrived)
"""
UNKNOWN = """
SELECT count(DISTINCT a.message_id) FROM chaos_arrivals AS a
WHERE NOT EXISTS (SELECT FROM outbox_messages AS m WHERE m.outbox_message_id = a.message_id)
"""


async def tally(conn: asyncpg.Connection, ledgers: Path) -> dict[str, Any]:
    """The count over ``conn``'s database and the ledgers in ``ledgers``."""
    async with conn.transaction():
        await conn.execute(LOAD)
        for path in sorted(ledgers.glob("arrivals-*.csv")):
            await conn.copy_to_table(
                "chaos_arrivals",
                source=str(path),
                columns=["arrived", "message_id", "enqueued", "source"],
                format="csv",
            )
        await conn.execute("ANALYZE chaos_arrivals")
        statuses = {row["status"]: row["messages"] for row in await conn.fetch(STATUSES)}
        delivered = await conn.fetchrow(DELIVERED)
        lost = await conn.fetch(LOST)
        duplicated = await conn.fetch(DUPLICATED)
        unknown = await conn.fetchval(UNKNOWN)
        await conn.execute("DROP TABLE chaos_arrivals")
    return {
        "committed": sum(statuses.values()),
        "statuses": statuses,
        "delivered_unique": delivered["unique"],
        "arrivals": delivered["arrivals"],
        "lost": len(lost),
        "duplicate_deliveries": sum(len(row["arrived"]) - 1 for row in duplicated),
        "duplicated_messages": len(duplicated),
        "unknown_arrivals": unknown,
        "lost_messages": [dict(row) for row in lost[:LISTED]],
        "duplicates": [dict(row) for row in duplicated[:LISTED]],
    }
