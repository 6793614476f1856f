"""Day-two operations against a real PostgreSQL: status, requeue, purge, show, attempt history."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import azure.functions as func
import pytest
from azure.functions.timer import TimerRequest

from outbox import operations
from outbox.azure import functions, triggers
from outbox.core.errors import BadRequestError
from outbox.operations import retention
from outbox.operations.requests import RequeueFilter
from outbox.relay.processor import OutboxProcessor
from outbox.store.postgres import PostgresStore
from outbox.transport.publisher import Publisher
from tests.conftest import SECRET
from tests.support.outbox_helpers import open_relay, row, run_cli, seed, statuses
from tests.support.receiver import Receiver, Reply


async def test_status_of_an_empty_outbox_is_healthy(db: Any, outbox_layout: str) -> None:
    status = (await operations.backlog_status(db, 900)).as_dict()
    assert abs(status.pop("clock_offset_seconds")) < 5  # the same machine's clock
    assert status.pop("layout")["layout"] == outbox_layout
    assert status == {
        "counts": {"Pending": 0, "Processing": 0, "Processed": 0, "Failed": 0},
        "oldest_due_pending_age_seconds": None,
        "oldest_unpublished_age_seconds": None,
        "oldest_failed_age_seconds": None,
        "expired_leases": 0,
        "held_back": 0,
        "open_breakers": [],
        "paused_endpoints": [],
        "alert_threshold_seconds": 900,
        "notify_queue_usage": 0.0,  # nobody holds PostgreSQL's NOTIFY queue
        "healthy": True,
        "problems": [],
        "estimated_counts": [],  # status counts every row
    }


async def make_backlog(db: Any) -> None:
    """Two Pending (one an hour old), one Failed two hours old, one expired lease, one done."""
    ids = await seed(db, 5)
    await db.execute(
        "UPDATE outbox_messages SET created_at = now() - interval '1 hour' "
        "WHERE outbox_message_id = $1",
        ids[0],
    )
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', created_at = now() - interval '2 hours' "
        "WHERE outbox_message_id = $1",
        ids[1],
    )
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processed', processed_at = now() "
        "WHERE outbox_message_id = $1",
        ids[2],
    )
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processing', "
        "lease_expires_at = now() - interval '1 minute', "
        "next_attempt_at = now() - interval '1 minute' WHERE outbox_message_id = $1",
        ids[3],
    )


async def test_status_reports_counts_ages_and_an_unhealthy_backlog(db: Any) -> None:
    await make_backlog(db)
    status = await operations.backlog_status(db, 900)
    assert status.counts == {"Pending": 2, "Processing": 1, "Processed": 1, "Failed": 1}
    assert 3590 < status.oldest_due_pending_age_seconds < 3700
    assert 3590 < status.oldest_unpublished_age_seconds < 3700
    assert 7190 < status.oldest_failed_age_seconds < 7300
    assert status.expired_leases == 1
    assert not status.healthy
    assert status.problems[0].startswith("oldest unpublished message is 36")
    assert (await operations.backlog_status(db, 7200)).healthy


async def test_status_counts_a_processing_row_without_a_lease_as_expired(db: Any) -> None:
    # Set by hand, such a row belongs to no worker: the next lease claims it, and status says so.
    [message_id] = await seed(db)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processing', lease_expires_at = NULL "
        "WHERE outbox_message_id = $1",
        message_id,
    )
    assert (await operations.backlog_status(db, 900)).expired_leases == 1


async def test_status_counts_a_backing_off_row_as_unpublished_but_not_due(db: Any) -> None:
    [message_id] = await seed(db)
    await db.execute(
        "UPDATE outbox_messages SET next_attempt_at = now() + interval '10 minutes', "
        "created_at = now() - interval '20 minutes'"
    )
    status = await operations.backlog_status(db, 900)
    assert status.oldest_due_pending_age_seconds is None
    assert status.oldest_unpublished_age_seconds > 1190
    assert not status.healthy
    assert (await row(db, message_id))["status"] == "Pending"


async def test_status_command_exits_non_zero_when_unhealthy(db: Any, database_url: str) -> None:
    env = {"OUTBOX_DATABASE_URL": database_url, "OUTBOX_ALERT_OLDEST_PENDING_SECONDS": "900"}
    healthy = await run_cli("status", env=env)
    assert (healthy.returncode, json.loads(healthy.stdout)["healthy"]) == (0, True)
    await make_backlog(db)
    unhealthy = await run_cli("status", env=env)
    assert unhealthy.returncode == 1
    assert json.loads(unhealthy.stdout)["counts"]["Failed"] == 1


async def failed_rows(db: Any) -> list[Any]:
    ids = await seed(db, 4, event_type="OrderCompleted")
    ids += await seed(db, 2, event_type="InvoicePaid")
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', attempt_count = 10, last_error = 'HTTP 410' "
        "WHERE outbox_message_id <> $1",
        ids[0],
    )
    await db.execute(
        "UPDATE outbox_messages SET created_at = now() - interval '3 days' "
        "WHERE outbox_message_id = $1",
        ids[1],
    )
    return ids


async def test_requeue_by_id_resets_the_attempt_budget_and_keeps_history(db: Any) -> None:
    ids = await failed_rows(db)
    report = await operations.requeue(
        db, RequeueFilter(message_ids=(ids[2], ids[0])), dry_run=False
    )
    assert (report.requeued, report.message_ids) == (1, [str(ids[2])])  # ids[0] was not Failed
    requeued = await row(db, ids[2])
    assert (requeued["status"], requeued["attempt_count"]) == ("Pending", 0)
    assert requeued["last_error"] == "HTTP 410"
    assert requeued["due_in"] <= 0
    assert await statuses(db) == {"Pending": 2, "Failed": 4}


@pytest.mark.parametrize(
    ("wanted", "count"),
    [
        (RequeueFilter(event_type="InvoicePaid"), 2),
        (RequeueFilter(created_to=datetime.now(UTC) - timedelta(days=1)), 1),
        (RequeueFilter(created_from=datetime.now(UTC) - timedelta(days=1)), 4),
        (
            RequeueFilter(
                event_type="OrderCompleted", created_from=datetime.now(UTC) - timedelta(days=1)
            ),
            2,
        ),
        (RequeueFilter(all_failed=True), 5),
    ],
)
async def test_requeue_filters_combine(db: Any, wanted: RequeueFilter, count: int) -> None:
    await failed_rows(db)
    dry = await operations.requeue(db, wanted, dry_run=True)
    assert (dry.requeued, dry.dry_run) == (count, True)
    assert (await statuses(db))["Failed"] == 5  # the dry run changed nothing
    done = await operations.requeue(db, wanted, dry_run=False)
    assert sorted(done.message_ids) == sorted(dry.message_ids)
    assert (await statuses(db)).get("Failed", 0) == 5 - count


@pytest.mark.parametrize(
    ("wanted", "error"),
    [
        (RequeueFilter(), "say which Failed messages to requeue"),
        (RequeueFilter(event_type="X", all_failed=True), "say which Failed messages"),
        (
            RequeueFilter(
                created_from=datetime(2026, 2, 1, tzinfo=UTC),
                created_to=datetime(2026, 1, 1, tzinfo=UTC),
            ),
            "created_from must be earlier than created_to",
        ),
        (RequeueFilter(created_from=datetime(2026, 1, 1)), "times need a UTC offset"),
        (
            RequeueFilter(
                created_from=datetime(2026, 1, 1), created_to=datetime(2026, 1, 2, tzinfo=UTC)
            ),
            "times need a UTC offset",
        ),
        (RequeueFilter(event_type="Invoice\x00Paid"), "event_type contains a NUL character"),
        (RequeueFilter(event_type="Invoice\udcff"), "event_type is not valid UTF-8 text"),
        (
            RequeueFilter(created_from=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))),
            "created_from is out of range",
        ),
        (
            RequeueFilter(
                created_to=datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1)))
            ),
            "created_to is out of range",
        ),
    ],
)
async def test_requeue_refuses_unclear_requests(db: Any, wanted: RequeueFilter, error: str) -> None:
    await failed_rows(db)
    with pytest.raises(BadRequestError, match=error):
        await operations.requeue(db, wanted, dry_run=False)
    assert (await statuses(db))["Failed"] == 5


async def test_requeue_command_and_its_dry_run(db: Any, database_url: str) -> None:
    await failed_rows(db)
    env = {"OUTBOX_DATABASE_URL": database_url}
    dry = await run_cli("requeue", "--event-type", "InvoicePaid", "--dry-run", env=env)
    assert (dry.returncode, json.loads(dry.stdout)["requeued"]) == (0, 2)
    assert (await statuses(db))["Failed"] == 5
    done = await run_cli("requeue", "--all-failed", "--yes", env=env)
    assert json.loads(done.stdout)["requeued"] == 5
    unclear = await run_cli("requeue", env=env)
    assert unclear.returncode == 2
    assert "say which Failed messages to requeue" in unclear.stderr
    assert "--all-failed (but not both)" in unclear.stderr  # its own flags, not the body's fields
    naive = await run_cli("requeue", "--created-from", "2026-01-02T00:00:00", env=env)
    assert (naive.returncode, "times need a UTC offset" in naive.stderr) == (2, True)


def http(method: str, route: str, body: bytes = b"") -> func.HttpRequest:
    return func.HttpRequest(method=method, url=f"/api/{route}", headers={}, params={}, body=body)


async def test_requeue_and_status_endpoints(db: Any, app_env: None) -> None:
    await failed_rows(db)
    bad = await functions.outbox_requeue(
        http("POST", "outbox/requeue", b'{"message_ids": ["nope"]}')
    )
    assert bad.status_code == 400
    assert json.loads(bad.get_body())["error"] == (
        "message_ids must be a non-empty list of message ids (UUIDs)"
    )
    unclear = await functions.outbox_requeue(http("POST", "outbox/requeue", b"{}"))
    assert unclear.status_code == 400
    dry = await functions.outbox_requeue(
        http("POST", "outbox/requeue", b'{"all_failed": true, "dry_run": true}')
    )
    assert (dry.status_code, json.loads(dry.get_body())["requeued"]) == (200, 5)
    status = await functions.outbox_status(http("GET", "outbox/status"))
    assert status.status_code == 200
    assert json.loads(status.get_body())["counts"]["Failed"] == 5
    done = await functions.outbox_requeue(
        http("POST", "outbox/requeue", b'{"event_type": "InvoicePaid"}')
    )
    assert json.loads(done.get_body())["requeued"] == 2
    await db.execute("UPDATE outbox_messages SET created_at = now() - interval '1 day'")
    unhealthy = await functions.outbox_status(http("GET", "outbox/status"))
    assert unhealthy.status_code == 503
    assert json.loads(unhealthy.get_body())["healthy"] is False


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"all_failed": "yes"}', "all_failed must be true or false"),
        (b'{"dry_run": 1, "all_failed": true}', "dry_run must be true or false"),
        (b'{"message_ids": []}', "message_ids must be a non-empty list of message ids (UUIDs)"),
        (b'{"created_from": "yesterday"}', "created_from must be an ISO 8601 time"),
        (b'{"event_type": ""}', "event_type must be a non-empty string"),
        (b'{"status": "Processed"}', "unknown field(s) in the body: status"),
        (b"[]", "the request body must be empty or a JSON object"),
    ],
)
async def test_requeue_endpoint_rejects_bad_bodies(
    db: Any, app_env: None, body: bytes, error: str
) -> None:
    response = await functions.outbox_requeue(http("POST", "outbox/requeue", body))
    assert response.status_code == 400
    assert json.loads(response.get_body()) == {"error": error}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            b'{"created_from": "2026-01-01T00:00:00", "created_to": "2026-01-02T00:00:00Z"}',
            "times need a UTC offset, e.g. 2026-01-02T00:00:00Z",
        ),
        (
            b'{"event_type": "\\udcff"}',
            "event_type is not valid UTF-8 text (it holds a lone surrogate)",
        ),
        (
            b'{"created_from": "0001-01-01T00:00:00+01:00"}',
            "created_from is out of range: in UTC it must fall within the years 1 to 9999",
        ),
        (
            b'{"created_to": "9999-12-31T23:59:59-01:00"}',
            "created_to is out of range: in UTC it must fall within the years 1 to 9999",
        ),
    ],
)
async def test_requeue_handler_refuses_values_the_database_cannot_hold_with_400(
    db: Any, app_env: None, body: bytes, error: str
) -> None:
    await failed_rows(db)
    assert await triggers.on_requeue_request(body) == (400, {"error": error})
    assert (await statuses(db))["Failed"] == 5


async def old_rows(db: Any, processed: int, failed: int = 0) -> None:
    await db.execute(
        "INSERT INTO outbox_messages "
        "(outbox_message_id, event_type, payload, status, processed_at, created_at) "
        "SELECT gen_random_uuid(), 'Old', '{}', 'Processed', now() - interval '30 days', "
        "now() - interval '31 days' FROM generate_series(1, $1)",
        processed,
    )
    await db.execute(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, created_at) "
        "SELECT gen_random_uuid(), 'Old', '{}', 'Failed', now() - interval '40 days' "
        "FROM generate_series(1, $1)",
        failed,
    )


def purged(report: dict[str, Any]) -> int:
    """Rows a purge removed, on either layout: the plain table's deletes; on the partitioned one
    the default partition's (these tests' old rows are older than any partition made)."""
    if report.get("layout") == "partitioned":
        assert report["partitions"]["dropped"] == []
        return int(report["partitions"]["default_rows_deleted"])
    return int(report["processed_deleted"] + report["failed_deleted"])


async def test_purge_deletes_only_rows_past_retention_with_their_attempts(
    db: Any, receiver: Receiver, make_settings: Any, outbox_layout: str
) -> None:
    await old_rows(db, processed=25, failed=3)
    await seed(db, 2)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()  # two fresh Processed rows, with attempt history
    old = await db.fetchval(
        "SELECT outbox_message_id FROM outbox_messages "
        "WHERE event_type = 'Old' AND status = 'Processed' LIMIT 1"
    )
    await db.execute(
        "INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, started_at, "
        "finished_at, duration_ms, outcome, applied) "
        "VALUES ($1, 1, gen_random_uuid(), now(), now(), 1, 'Processed', true)",
        old,
    )
    report = await operations.purge(db, retention_days=7, failed_retention_days=None, batch_size=10)
    assert purged(report.as_dict()) == 25
    if outbox_layout == "plain":
        assert (report.processed_deleted, report.failed_deleted, report.batches) == (25, 0, 3)
    assert await statuses(db) == {"Processed": 2, "Failed": 3}
    assert (
        await db.fetchval("SELECT count(*) FROM outbox_attempts WHERE outbox_message_id = $1", old)
        == 0
    )
    assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 2
    report = await operations.purge(db, retention_days=7, failed_retention_days=30, batch_size=10)
    assert purged(report.as_dict()) == 3
    if outbox_layout == "plain":
        assert (report.processed_deleted, report.failed_deleted) == (0, 3)
    assert await statuses(db) == {"Processed": 2}


async def test_racing_purges_all_succeed_and_together_remove_each_row_once(
    db: Any, database_url: str, outbox_layout: str
) -> None:
    """Every replica's purge timer may fire at the same moment (docs/operations.md): on the
    partitioned layout they used to collide making the same partitions ahead
    (UniqueViolationError on pg_type, DuplicateTableError) and dropping the same ones."""
    await old_rows(db, processed=40, failed=2)
    if outbox_layout == "partitioned":
        from outbox.store import partitions

        # A day of partitions past retention, and the days ahead to make again: work for each.
        day = datetime.now(UTC) - timedelta(days=20)
        await partitions.ensure_partitions(db, day, day + timedelta(days=1))
        await db.execute(
            "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, "
            "processed_at, created_at) "
            "SELECT gen_random_uuid(), 'Old', '{}', 'Processed', $1, $1 FROM generate_series(1, 9)",
            day,
        )
        for part in (await partitions.partitions_of(db, "outbox_messages"))[-4:-1]:
            await db.execute(f"DROP TABLE {part.name}")
    purgers = [await asyncpg.connect(database_url) for _ in range(3)]
    try:
        for _ in range(4):  # rounds of three at once, as replicas' timers would
            reports = await asyncio.gather(
                *(
                    operations.purge(c, retention_days=7, failed_retention_days=None, batch_size=7)
                    for c in purgers
                ),
                return_exceptions=True,
            )
            assert [r for r in reports if isinstance(r, BaseException)] == []
    finally:
        for conn in purgers:
            await conn.close()
    assert await statuses(db) == {"Failed": 2}
    if outbox_layout == "partitioned":
        from outbox.store import partitions

        names = [p.name for p in await partitions.partitions_of(db, "outbox_messages")]
        assert len(names) == len(set(names))
        assert f"outbox_messages_p{day.strftime('%Y%m%d')}" not in names
        ahead = await partitions.ensure_partitions(db)
        assert ahead == []  # the racing purges left every partition ahead made, once


async def test_purge_goes_by_the_finish_time_and_reads_on_from_the_last_row_it_deleted(
    db: Any, outbox_layout: str
) -> None:
    # 25 rows finished 30 days ago, and 15 created as long ago but finished yesterday (retried
    # for a month): created in the same instant (one transaction, one now()), so that the ids
    # interleave them in the order the purge reads (created_at, id).
    async with db.transaction():
        await old_rows(db, processed=25)
        await db.execute(
            "INSERT INTO outbox_messages "
            "(outbox_message_id, event_type, payload, status, processed_at, created_at) "
            "SELECT gen_random_uuid(), 'Late', '{}', 'Processed', now() - interval '1 day', "
            "now() - interval '31 days' FROM generate_series(1, 15)"
        )
    order = await db.fetch(
        "SELECT outbox_message_id, created_at, event_type FROM outbox_messages "
        "ORDER BY created_at, outbox_message_id"
    )
    old = [(r["created_at"], r["outbox_message_id"]) for r in order if r["event_type"] == "Old"]
    kinds = [r["event_type"] for r in order]
    assert kinds.index("Late") < len(old)  # some Late row comes before the last Old one

    # From a position: only what follows it goes, however many rows come before it.
    deleted, last = await retention.purge_processed(db, 7, 100, after=old[9])
    assert (deleted, last) == (15, old[-1])
    left = {
        r["outbox_message_id"]
        for r in await db.fetch("SELECT outbox_message_id FROM outbox_messages")
    }
    assert {message_id for _, message_id in old[:10]} <= left
    assert not {message_id for _, message_id in old[10:]} & left
    assert await retention.purge_processed(db, 7, 100, after=old[-1]) == (0, None)

    # The whole purge: every row finished before the cutoff, none finished after it.
    report = await operations.purge(db, retention_days=7, failed_retention_days=None, batch_size=4)
    assert purged(report.as_dict()) == 10
    if outbox_layout == "plain":
        assert (report.processed_deleted, report.batches) == (10, 3)
    assert await db.fetchval("SELECT count(*) FROM outbox_messages WHERE event_type = 'Late'") == 15
    assert await statuses(db) == {"Processed": 15}


async def test_only_the_partitioned_layout_indexes_processed_rows_by_finish_time(
    db: Any, outbox_layout: str
) -> None:
    # Migration 0020: the plain table's purge reads the created-order index, one index entry
    # less at every outcome write; a partition's drop reads processed_at for live rows under its
    # lock, so the partitioned layout keeps the index, on the parent and every partition.
    indexes = {
        (r["tablename"], r["indexname"])
        for r in await db.fetch(
            "SELECT tablename, indexname FROM pg_indexes WHERE tablename LIKE 'outbox_messages%'"
        )
    }
    names = {name for _, name in indexes}
    assert "outbox_messages_processed_order_idx" in names
    if outbox_layout == "plain":
        assert "outbox_messages_processed_idx" not in names
    else:
        assert ("outbox_messages", "outbox_messages_processed_idx") in indexes
        partitions = {table for table, _ in indexes if table != "outbox_messages"}
        assert partitions
        for table in partitions:
            assert any(
                name.startswith(table) and "processed_at" in name
                for t, name in indexes
                if t == table
            ), table


async def test_purge_command_and_the_daily_timer(
    db: Any, database_url: str, app_env: None, outbox_layout: str
) -> None:
    await old_rows(db, processed=5, failed=2)
    result = await run_cli(
        "purge", env={"OUTBOX_DATABASE_URL": database_url, "OUTBOX_FAILED_RETENTION_DAYS": "30"}
    )
    printed = json.loads(result.stdout)
    assert purged(printed) == 7
    if outbox_layout == "plain":
        assert printed == {"processed_deleted": 5, "failed_deleted": 2, "batches": 2}
    await old_rows(db, processed=4)
    await functions.outbox_purge(TimerRequest())
    assert await statuses(db) == {}


@pytest.mark.slow
async def test_purging_200k_rows_does_not_stall_a_running_drain(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any, outbox_layout: str
) -> None:
    await old_rows(db, processed=200_000)
    await seed(db, 200)
    settings = make_settings(batch_size=20)
    # Any lock wait over a second fails the relay's statement, and the drain would report it.
    pool = await asyncpg.create_pool(
        database_url, min_size=0, max_size=4, server_settings={"lock_timeout": "1s"}
    )
    publisher = Publisher.from_settings(settings)
    processor = OutboxProcessor(PostgresStore(pool), publisher.deliver, settings)
    purger = await asyncpg.connect(database_url)
    try:
        # A purge batch caught mid-transaction, holding its row locks: the drain goes past it.
        async with purger.transaction():
            assert await retention.purge_batch(purger, "Processed", 7, 1000) == 1000
            during_batch = await processor.execute()
        # The whole purge, batch after batch, while a second drain runs.
        await seed(db, 200)
        purge = asyncio.create_task(
            operations.purge(purger, retention_days=7, failed_retention_days=None, batch_size=1000)
        )
        during_purge = await processor.execute()
        report = await purge
    finally:
        await purger.close()
        await publisher.close()
        await pool.close()
    for summary in (during_batch, during_purge):
        assert (summary.error, summary.processed) == (None, 200)
    assert purged(report.as_dict()) == 199_000
    if outbox_layout == "plain":
        assert report.batches == 200
    assert await statuses(db) == {"Processed": 400}


async def test_deleting_messages_by_hand_deletes_their_history(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 3)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    await db.execute("DELETE FROM outbox_messages WHERE outbox_message_id = ANY ($1)", ids[:2])
    attempts = await db.fetch("SELECT outbox_message_id FROM outbox_attempts")
    assert [r["outbox_message_id"] for r in attempts] == [ids[2]]
    await db.execute("TRUNCATE outbox_messages")
    assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 0


async def test_show_lists_every_attempt_with_its_outcome(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(503, b"busy", headers={"Retry-After": "1"}))
    [message_id] = await seed(db)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
        await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
        await relay.processor.execute()
    result = await run_cli("show", str(message_id), env={"OUTBOX_DATABASE_URL": database_url})
    shown = json.loads(result.stdout)
    assert (shown["status"], shown["attempt_count"]) == ("Processed", 2)
    assert shown["payload"] == {"orderId": 0}
    first, second = shown["attempts"]
    assert (first["attempt_number"], first["outcome"], first["http_status"]) == (1, "Pending", 503)
    assert (first["error"], first["response_snippet"], first["applied"]) == (
        "HTTP 503: busy",
        "busy",
        True,
    )
    assert (second["attempt_number"], second["outcome"], second["http_status"]) == (
        2,
        "Processed",
        200,
    )
    assert second["error"] is None
    assert datetime.fromisoformat(second["started_at"]) >= datetime.fromisoformat(
        first["finished_at"]
    )
    missing = await run_cli(
        "show", "00000000-0000-0000-0000-000000000000", env={"OUTBOX_DATABASE_URL": database_url}
    )
    assert missing.returncode == 1
    assert "no outbox message" in missing.stderr


async def test_show_of_a_finished_row_says_when_it_finished_and_nothing_due(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any
) -> None:
    failed, processed = await seed(db, 2)
    receiver.responder = lambda r: Reply(410, b"gone") if r.webhook_id == str(failed) else Reply()
    pending, *_ = await seed(db, 1)
    await db.execute(
        "UPDATE outbox_messages SET next_attempt_at = now() + interval '1 hour' "
        "WHERE outbox_message_id = $1",
        pending,
    )
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    env = {"OUTBOX_DATABASE_URL": database_url}
    shown = {}
    for message_id in (failed, processed, pending):
        result = await run_cli("show", str(message_id), env=env)
        shown[message_id] = json.loads(result.stdout)
    assert [shown[m]["status"] for m in (failed, processed, pending)] == [
        "Failed",
        "Processed",
        "Pending",
    ]
    for message_id in (failed, processed):
        row_shown = shown[message_id]
        # Its last lease left both columns behind (a lease's expiry, its start): not true now.
        assert (row_shown["next_attempt_at"], row_shown["processing_started_at"]) == (None, None)
        assert len(row_shown["attempts"]) == 1
        assert row_shown["finished_at"] is not None
    assert shown[processed]["finished_at"] == shown[processed]["processed_at"]
    assert shown[failed]["finished_at"] == shown[failed]["attempts"][-1]["finished_at"]
    # A message still under way: when it is due, and no finish.
    assert shown[pending]["next_attempt_at"] is not None
    assert shown[pending]["finished_at"] is None
    columns = await row(db, failed)
    assert columns["next_attempt_at"] is not None  # the row itself is left as it is


async def test_history_records_error_classes_and_stale_attempts(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    slow = asyncio.Event()
    receiver.script("/orders", Reply(500, b"late", hold=slow), Reply(200))
    [message_id] = await seed(db)
    await seed(db, event_type="Nowhere")
    async with open_relay(make_settings()) as first, open_relay(make_settings()) as second:
        stale = asyncio.create_task(first.processor.execute())
        await receiver.wait_for(1)
        await db.execute(
            "UPDATE outbox_messages SET lease_expires_at = now(), next_attempt_at = now() "
            "WHERE outbox_message_id = $1",
            message_id,
        )
        await second.processor.execute()
        slow.set()
        await stale
    attempts = await db.fetch(
        "SELECT a.*, m.event_type FROM outbox_attempts a "
        "JOIN outbox_messages m USING (outbox_message_id) "
        "ORDER BY attempt_id"
    )
    by_type = {(a["event_type"], a["applied"]): a for a in attempts}
    assert by_type[("Nowhere", True)]["error_class"] == "Undeliverable"
    assert by_type[("Nowhere", True)]["outcome"] == "Failed"
    assert by_type[("OrderCompleted", True)]["http_status"] == 200
    late = by_type[("OrderCompleted", False)]
    assert (late["http_status"], late["outcome"], late["attempt_number"]) == (500, "Pending", 1)


async def test_each_outcome_and_batch_is_logged_with_fields_and_no_secrets(
    db: Any, receiver: Receiver, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="outbox")
    receiver.script("/orders", Reply(200), Reply(503, b"no"), Reply(410, b"gone"))
    ids = await seed(db, 3)
    async with open_relay(make_settings(concurrency=1)) as relay:
        await relay.processor.execute()
    outcomes = [r for r in caplog.records if getattr(r, "outbox_event", None) == "outbox.delivery"]
    assert sorted((r.outbox_outcome, r.levelno) for r in outcomes) == [
        ("Failed", logging.ERROR),
        ("Pending", logging.WARNING),
        ("Processed", logging.DEBUG),
    ]
    assert {r.outbox_message_id for r in outcomes} == set(ids)
    assert {r.outbox_event_type for r in outcomes} == {"OrderCompleted"}
    assert all(isinstance(r.outbox_duration_ms, int) for r in outcomes)
    [batch] = [r for r in caplog.records if getattr(r, "outbox_event", None) == "outbox.batch"]
    assert (batch.levelno, batch.outbox_processed, batch.outbox_retried, batch.outbox_failed) == (
        logging.INFO,
        1,
        1,
        1,
    )
    assert "outbox.delivery message_id=" in outcomes[0].getMessage()
    assert SECRET.removeprefix("whsec_") not in caplog.text
    assert "/orders" not in caplog.text


async def test_a_role_that_may_delete_messages_deletes_their_history_from_any_search_path(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any
) -> None:
    ids = await seed(db, 3)
    async with open_relay(make_settings()) as relay:
        await relay.processor.execute()
    # A clean-up role may delete and truncate messages, and nothing else; its session does not
    # look in the outbox's schema.
    role = f"outbox_cleanup_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role}")
    try:
        await db.execute(f"GRANT SELECT, DELETE, TRUNCATE ON outbox_messages TO {role}")
        cleaner = await asyncpg.connect(database_url, server_settings={"search_path": "pg_catalog"})
        try:
            await cleaner.execute(f"SET ROLE {role}")
            await cleaner.execute(
                "DELETE FROM public.outbox_messages WHERE outbox_message_id = $1", ids[0]
            )
            left = await db.fetch("SELECT outbox_message_id FROM outbox_attempts")
            assert sorted(r["outbox_message_id"] for r in left) == sorted(ids[1:])
            await cleaner.execute("TRUNCATE public.outbox_messages")
        finally:
            await cleaner.close()
        assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 0
    finally:
        await db.execute(f"REVOKE ALL ON outbox_messages FROM {role}")
        await db.execute(f"DROP ROLE {role}")
