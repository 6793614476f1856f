"""The benchmark's steady rate of a drain (bench.common.outbox_steady_rate), on rows whose
outcome times are set: the latency-bound targets are judged on it."""

from __future__ import annotations

from typing import Any

from bench.common import outbox_steady_rate
from tests.support.outbox_helpers import seed_many


async def _processed_in_batches(db: Any, times: list[float]) -> None:
    """Ten rows marked Processed per entry of ``times`` (seconds after a fixed instant)."""
    await seed_many(db, 10 * len(times))
    await db.execute(
        "WITH numbered AS (SELECT outbox_message_id, (row_number() OVER ()) - 1 AS n "
        "FROM outbox_messages) "
        "UPDATE outbox_messages m SET status = 'Processed', "
        "processed_at = timestamptz '2026-01-01' "
        "+ make_interval(secs => ($1::float8[])[n / 10 + 1]) "
        "FROM numbered WHERE numbered.outbox_message_id = m.outbox_message_id",
        times,
    )


async def test_the_steady_rate_leaves_out_a_slow_start_and_a_slow_end(db: Any) -> None:
    # Ten batches of ten: the first after 3 s (a start), one a second, the last 5 s late.
    await _processed_in_batches(db, [3, 4, 5, 6, 7, 8, 9, 10, 11, 16])
    # Between the 10th and the 90th percentile (the first and ninth batches: 8 s apart), the
    # eight batches after the first: 80 rows in 8 s.
    assert await outbox_steady_rate(db) == 10.0


async def test_a_drain_in_one_outcome_write_has_no_steady_rate(db: Any) -> None:
    await _processed_in_batches(db, [1])
    assert await outbox_steady_rate(db) == 0.0
