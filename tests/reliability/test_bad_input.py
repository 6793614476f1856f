"""Rows written by hand, outside ``enqueue()``: the relay neither gets stuck on them nor lets them
take its memory. (Bad payloads at enqueue, garbage hints, bad drain parameters and bad settings
are proved in tests/unit and tests/integration; docs/reliability.md lists where.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from outbox.core.outcomes import MAX_ERROR_CHARS
from outbox.core.telemetry import MAX_TRACE_CONTEXT_CHARS, OVERSIZE_KEY
from outbox.store.postgres import PostgresStore
from tests.support.instrumented_relay import memory_growth_kib
from tests.support.outbox_helpers import open_relay, row, seed
from tests.support.receiver import Receiver
from tests.support.relay_process import relay_env, run_relay

HUGE_BYTES = 20 * 1024 * 1024


async def test_a_processing_row_without_a_lease_is_leased_and_delivered(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # An UPDATE by hand (or a tool) left a row Processing with no lease: no worker holds it.
    message_id = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status) "
        "VALUES (gen_random_uuid(), 'OrderCompleted', '{\"orderId\": 1}', 'Processing') "
        "RETURNING outbox_message_id"
    )
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 1)


async def test_a_lease_expired_by_hand_takes_effect_at_once(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    [message_id] = await seed(db)
    # A worker leased it for an hour and is stuck; the operator ends its lease by hand, setting
    # only the lease's own deadline (next_attempt_at still shows the hour).
    await PostgresStore(db).lease_batch(10, 3600)
    await db.execute(
        "UPDATE outbox_messages SET lease_expires_at = now() WHERE outbox_message_id = $1",
        message_id,
    )
    async with open_relay(make_settings()) as relay:
        summary = await relay.processor.execute()
    assert summary.processed == 1
    assert [r.webhook_id for r in receiver.requests] == [str(message_id)]
    stored = await row(db, message_id)
    assert (stored["status"], stored["attempt_count"]) == ("Processed", 2)


async def test_huge_rows_written_by_hand_fail_without_being_loaded_into_the_relay(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    huge = await db.fetch(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
        "SELECT gen_random_uuid(), 'OrderCompleted', jsonb_build_object('blob', repeat('x', $1)) "
        "FROM generate_series(1, 3) RETURNING outbox_message_id",
        HUGE_BYTES,
    )
    result = await run_relay(
        relay_env(database_url, webhooks), "--", "drain", module="tests.support.instrumented_relay"
    )
    assert result.returncode == 0, result.stderr
    assert result.summary["failed"] == 3
    assert receiver.requests == []
    for record in huge:
        stored = await row(db, record["outbox_message_id"])
        assert stored["status"] == "Failed"
        assert stored["last_error"] == (
            f"payload is {HUGE_BYTES + 12} bytes, above OUTBOX_MAX_PAYLOAD_BYTES=1048576"
        )
        assert len(stored["last_error"]) <= MAX_ERROR_CHARS
    # 60 MB of payloads were leased and none of it crossed into the relay: its memory grew by
    # about 1 MB over the run (a relay that fetches them grows by about 100 MB).
    assert memory_growth_kib(result.stderr) * 1024 < HUGE_BYTES // 2


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
THIRTY_MB = 30 * 1024 * 1024


async def _insert_with_trace_context(db: Any, trace_context_sql: str, count: int = 2) -> list[Any]:
    """``count`` rows written by hand, each with the trace context the SQL expression makes."""
    rows = await db.fetch(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, trace_context) "
        f"SELECT gen_random_uuid(), 'OrderCompleted', '{{\"orderId\": 1}}', ({trace_context_sql}) "
        "FROM generate_series(1, $1) RETURNING outbox_message_id",
        count,
    )
    return [r["outbox_message_id"] for r in rows]


def _trace_context_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if "trace_context is ignored" in line]


@pytest.mark.parametrize("depth", [5_000, 2_000])
async def test_a_deeply_nested_trace_context_is_ignored_and_the_message_delivered(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any], depth: int
) -> None:
    # 5,000 deep is over the bound; 2,000 deep fits it, and is too deep for Python's json.
    nested = f"repeat('[', {depth}) || repeat(']', {depth})"
    ids = await _insert_with_trace_context(
        db, f"""('{{"traceparent": "{TRACEPARENT}", "x": ' || {nested} || '}}')::jsonb"""
    )
    result = await run_relay(relay_env(database_url, webhooks), "drain")
    assert result.returncode == 0, result.stderr
    assert result.summary["processed"] == 2
    assert sorted(r.webhook_id for r in receiver.requests) == sorted(map(str, ids))
    for message_id in ids:
        assert (await row(db, message_id))["status"] == "Processed"
    # One warning for the two messages (the same value), and no traceback.
    assert len(_trace_context_warnings(result.stderr)) == 1
    assert "Traceback" not in result.stderr


async def test_a_trace_context_with_a_line_break_is_ignored_and_forges_no_log_line(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    forged = "ERROR outbox.drain: FORGED LINE"
    tracestate = f"congo=t61rcWkgMzE\\r\\n{forged}"  # a JSON escape: CR LF in the jsonb value
    ids = await _insert_with_trace_context(
        db, f"""'{{"traceparent": "{TRACEPARENT}", "tracestate": "{tracestate}"}}'::jsonb"""
    )
    result = await run_relay(relay_env(database_url, webhooks), "drain")
    assert result.returncode == 0, result.stderr
    assert result.summary["processed"] == 2
    assert sorted(r.webhook_id for r in receiver.requests) == sorted(map(str, ids))
    assert all("tracestate" not in r.headers for r in receiver.requests)
    output = result.stdout + result.stderr
    assert not [line for line in output.splitlines() if line.startswith(forged)]
    [warning] = _trace_context_warnings(result.stderr)
    assert "\\r\\n" + forged in warning  # shown as the row holds it: JSON, escaped


async def test_a_30_mb_trace_context_is_not_fetched_and_the_message_delivered(
    db: Any, database_url: str, receiver: Receiver, webhooks: dict[str, Any]
) -> None:
    [huge] = await _insert_with_trace_context(
        db,
        f"jsonb_build_object('traceparent', '{TRACEPARENT}', 'pad', repeat('x', {THIRTY_MB}))",
        count=1,
    )
    chars = await db.fetchval("SELECT length(trace_context::text) FROM outbox_messages")
    assert chars > THIRTY_MB
    [plain] = await seed(db)
    # The lease returns a small stand-in with the context's length in place of the context;
    # a row without one still has none.
    lease = await PostgresStore(db).lease_batch(10, 60)
    contexts = {m.message_id: m.trace_context for m in lease.messages}
    assert contexts[plain] is None
    assert json.loads(contexts[huge]) == {OVERSIZE_KEY: chars}
    await db.execute("UPDATE outbox_messages SET lease_expires_at = now()")
    result = await run_relay(
        relay_env(database_url, webhooks), "--", "drain", module="tests.support.instrumented_relay"
    )
    assert result.returncode == 0, result.stderr
    assert result.summary["processed"] == 2
    assert (await row(db, huge))["status"] == "Processed"
    [warning] = _trace_context_warnings(result.stderr)
    assert f"{chars} characters, over {MAX_TRACE_CONTEXT_CHARS}" in warning
    # None of the 30 MB crossed into the relay: a relay that fetches it grows by about 85 MB.
    assert memory_growth_kib(result.stderr) * 1024 < THIRTY_MB // 2
