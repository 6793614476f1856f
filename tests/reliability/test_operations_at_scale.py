"""Operations over many rows keep the relay's memory flat: they work in batches."""

from __future__ import annotations

import json
from typing import Any

import pytest

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
        module="tests.support.instrumented_relay",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (report["requeued"], len(report["message_ids"])) == (FAILED_ROWS, 1000)
    assert await statuses(db) == {"Pending": FAILED_ROWS}
    # Fetching every id used to cost about 155 bytes per row (31 MB here); batches cost none.
    assert memory_growth_kib(result.stderr) < 8 * 1024
