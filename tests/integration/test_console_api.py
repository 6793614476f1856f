"""The operator's console's JSON API against a real PostgreSQL: overview, the message list and its
filters, a message's detail, pause and resume, requeue by filter with its record."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

import azure.functions as func
import pytest

from outbox.azure import functions
from outbox.core.errors import BadRequestError
from outbox.operations import actions, views
from outbox.operations.list_query import MESSAGE_FLAGS, parse_message_query
from tests.conftest import SECRET
from tests.support.outbox_helpers import open_relay, run_cli, seed, statuses
from tests.support.receiver import Receiver


def get(route: str, params: dict[str, str] | None = None, **route_params: str) -> Any:
    query = urlencode(params or {})
    return func.HttpRequest(
        method="GET",
        url=f"http://localhost/api/{route}" + (f"?{query}" if query else ""),
        headers={"x-functions-key": "the-operators-key-0123"},
        params=params or {},
        route_params=route_params,
        body=b"",
    )


def post(route: str, body: dict[str, Any]) -> Any:
    return func.HttpRequest(
        method="POST",
        url=f"http://localhost/api/{route}",
        headers={"x-functions-key": "the-operators-key-0123"},
        params={},
        body=json.dumps(body).encode(),
    )


def answer(response: func.HttpResponse) -> tuple[int, Any]:
    return response.status_code, json.loads(response.get_body())


async def failed(db: Any, count: int, error: str, event_type: str = "OrderCompleted") -> list[Any]:
    ids = await seed(db, count, event_type)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', last_error = $2 "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids,
        error,
    )
    return ids


async def test_overview_counts_and_groups_failures_by_reason(db: Any, app_env: None) -> None:
    await seed(db, 2)
    await failed(db, 3, "HTTP 503: <b>down</b>")
    await failed(
        db, 1, "no endpoint configured for event type 'Nope' (set OUTBOX_WEBHOOKS)", "Nope"
    )
    status, body = answer(await functions.outbox_overview(get("outbox/overview")))
    assert status == 200
    assert body["counts"] == {"Pending": 2, "Processing": 0, "Processed": 0, "Failed": 4}
    assert body["estimated_counts"] == []  # counted, every one
    reasons = {r["reason"]: r["messages"] for r in body["failure_reasons"]}
    assert reasons == {
        "HTTP 503: <b>down</b>": 3,
        "no endpoint configured for event type '…' (set OUTBOX_WEBHOOKS)": 1,
    }
    assert len(body["rates"]) == 60
    assert body["paused_endpoints"] == []


async def test_the_overview_estimates_processed_beyond_what_it_counts_and_says_so(
    db: Any, app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "PROCESSED_COUNTED", 3)
    ids = await seed(db, 7)
    await db.execute(
        "UPDATE outbox_messages SET status = 'Processed', processed_at = now() "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids[:5],
    )
    await db.execute("ANALYZE outbox_messages")  # what autovacuum keeps: the row estimate
    body = answer(await functions.outbox_overview(get("outbox/overview")))[1]
    assert body["estimated_counts"] == ["Processed"]
    assert body["counts"] == {"Pending": 2, "Processing": 0, "Processed": 5, "Failed": 0}


async def test_a_filter_no_index_serves_reads_a_bounded_scan_and_goes_on_where_it_stopped(
    db: Any, app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "CONSOLE_SCAN_LIMIT", 4)
    invoices = await seed(db, 6, "InvoicePaid")
    await seed(db, 5)  # newer: the first scan of 4 rows finds no InvoicePaid
    params = {"event_type": "InvoicePaid", "limit": "50"}
    body = answer(await functions.outbox_messages(get("outbox/messages", params)))[1]
    assert (body["messages"], body["scan_limited"], body["scan_limit"]) == ([], True, 4)
    seen = []
    while body["next"]:
        params["after"] = body["next"]
        body = answer(await functions.outbox_messages(get("outbox/messages", params)))[1]
        seen += [m["outbox_message_id"] for m in body["messages"]]
    assert sorted(seen) == sorted(str(i) for i in invoices)  # each once, none missed


async def test_messages_filter_and_page_by_keyset(db: Any, app_env: None) -> None:
    await seed(db, 3)
    ids = await failed(db, 5, "HTTP 500: boom")
    wanted = await failed(db, 1, "HTTP 418: teapot")
    status, body = answer(
        await functions.outbox_messages(get("outbox/messages", {"status": "Failed", "limit": "2"}))
    )
    assert (status, len(body["messages"])) == (200, 2)
    assert body["next"]
    seen = [m["outbox_message_id"] for m in body["messages"]]
    while body["next"]:
        params = {"status": "Failed", "limit": "2", "after": body["next"]}
        body = answer(await functions.outbox_messages(get("outbox/messages", params)))[1]
        seen += [m["outbox_message_id"] for m in body["messages"]]
    assert sorted(seen) == sorted(str(i) for i in [*ids, *wanted])
    found = answer(await functions.outbox_messages(get("outbox/messages", {"error": "TEAPOT"})))
    assert [m["outbox_message_id"] for m in found[1]["messages"]] == [str(wanted[0])]
    by_endpoint = answer(
        await functions.outbox_messages(get("outbox/messages", {"endpoint": "OrderCompleted"}))
    )
    assert len(by_endpoint[1]["messages"]) == 9


async def test_bad_filters_are_400s_naming_the_parameter(db: Any, app_env: None) -> None:
    for params, named in [
        ({"status": "Lost"}, "status must be one of"),
        ({"created_from": "yesterday"}, "created_from must be an ISO 8601 time"),
        ({"limit": "5000"}, "limit must be a whole number"),
        ({"after": "nope"}, "after must be the cursor"),
        ({"colour": "red"}, "unknown parameter(s): colour"),
    ]:
        status, body = answer(await functions.outbox_messages(get("outbox/messages", params)))
        assert (status, named in body["error"]) == (400, True), body
    status, body = answer(
        await functions.outbox_message(get("outbox/messages/x", message_id="not-a-uuid"))
    )
    assert (status, body["error"]) == (400, "message_id must be a message id (a UUID)")


async def test_detail_shows_payload_endpoints_attempts_and_trace_id(db: Any, app_env: None) -> None:
    [message_id] = await seed(db, 1, payload=lambda i: {"note": "<script>alert(1)</script>"})
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await db.execute(
        "UPDATE outbox_messages SET trace_context = $2::jsonb WHERE outbox_message_id = $1",
        message_id,
        json.dumps({"traceparent": trace}),
    )
    await functions.outbox_drain(post("outbox/drain", {}))
    status, body = answer(
        await functions.outbox_message(get("outbox/messages/x", message_id=str(message_id)))
    )
    assert status == 200
    assert body["status"] == "Processed"
    assert json.loads(body["payload"]) == {"note": "<script>alert(1)</script>"}
    assert body["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert [a["outcome"] for a in body["attempts"]] == ["Processed"]
    assert "lease_token" not in body["attempts"][0]
    missing = await functions.outbox_message(get("outbox/messages/x", message_id=str(uuid.uuid4())))
    assert missing.status_code == 404


async def test_requeue_by_error_text_is_planned_then_done_once_and_recorded(
    db: Any, app_env: None
) -> None:
    timeouts = await failed(db, 3, "HTTP 504: gateway timeout")
    await failed(db, 2, "HTTP 400: bad")
    status, plan = answer(
        await functions.outbox_requeue(post("outbox/requeue", {"error": "504", "dry_run": True}))
    )
    assert (status, plan["requeued"], plan["endpoints"]) == (200, 3, ["OrderCompleted"])
    body = {"error": "504", "action_id": "click-1"}
    first = answer(await functions.outbox_requeue(post("outbox/requeue", body)))[1]
    again = answer(await functions.outbox_requeue(post("outbox/requeue", body)))[1]
    assert (first["requeued"], first["repeated"]) == (3, False)
    assert (again["requeued"], again["repeated"]) == (3, True)
    pending = await db.fetch("SELECT outbox_message_id FROM outbox_messages WHERE status='Pending'")
    assert sorted(r[0] for r in pending) == sorted(timeouts)
    recorded = answer(await functions.outbox_actions(get("outbox/actions")))[1]["actions"]
    assert len(recorded) == 1
    assert recorded[0]["action"] == "requeue"
    assert recorded[0]["filter"] == {"error": "504"}
    assert recorded[0]["affected"] == 3
    assert recorded[0]["actor"] == "function key"  # the Functions host says no more
    assert "the-operators-key" not in json.dumps(recorded)


async def test_a_requeue_in_batches_reports_progress_and_a_retried_batch_requeues_nothing_twice(
    db: Any, app_env: None
) -> None:
    timeouts = await failed(db, 5, "HTTP 504: gateway timeout")
    others = await failed(db, 2, "HTTP 400: bad")
    # Written in an order whose ids run against their times: the UPDATE returns a batch by id,
    # and the next batch must still start after the batch's last row by (created_at, id).
    await db.execute(
        "UPDATE outbox_messages AS m SET created_at = now() - make_interval(secs => r.n) "
        "FROM (SELECT outbox_message_id, row_number() OVER (ORDER BY outbox_message_id) AS n "
        "      FROM outbox_messages) AS r WHERE r.outbox_message_id = m.outbox_message_id"
    )
    body = {"error": "504", "action_id": "batches-1", "batch_size": 2}

    async def step() -> dict[str, Any]:
        status, shown = answer(await functions.outbox_requeue(post("outbox/requeue", body)))
        assert status == 200, shown
        return dict(shown)

    first = await step()
    assert (first["requeued"], first["batch_requeued"], first["done"]) == (2, 2, False)
    # The first batch's rows fail again before the next call: no later batch of this requeue
    # (a retried call, a repeated click) sets them back again; the batches go on after them.
    again_failed = [uuid.UUID(i) for i in first["message_ids"]]
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', attempt_count = 7 "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        again_failed,
    )
    second, third, after = await step(), await step(), await step()
    assert [(s["requeued"], s["batch_requeued"], s["done"]) for s in (second, third)] == [
        (4, 2, False),
        (5, 1, True),
    ]
    assert (after["requeued"], after["batch_requeued"], after["repeated"]) == (5, 0, True)
    rows = {
        r["outbox_message_id"]: r["status"]
        for r in await db.fetch("SELECT outbox_message_id, status FROM outbox_messages")
    }
    assert {i for i in timeouts if rows[i] == "Pending"} == set(timeouts) - set(again_failed)
    assert all(rows[i] == "Failed" for i in [*again_failed, *others])
    assert await db.fetchval(
        "SELECT bool_and(attempt_count = 7) FROM outbox_messages "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        again_failed,
    )
    recorded = answer(await functions.outbox_actions(get("outbox/actions")))[1]["actions"]
    assert [(r["action"], r["affected"], r["result"]["batches"]) for r in recorded] == [
        ("requeue", 5, 3)
    ]
    # The same action id with another filter is refused, naming it.
    other = answer(await functions.outbox_requeue(post("outbox/requeue", body | {"error": "400"})))
    assert other[0] == 400
    assert "batches-1" in other[1]["error"]


async def test_a_requeue_in_batches_needs_an_action_id_and_a_sane_batch_size(
    db: Any, app_env: None
) -> None:
    await failed(db, 1, "HTTP 504")
    for body, named in (
        ({"error": "504", "batch_size": 2}, "action_id"),
        ({"error": "504", "batch_size": 0, "action_id": "a"}, "batch_size"),
        ({"error": "504", "batch_size": "2", "action_id": "a"}, "batch_size"),
        ({"error": "504", "batch_size": 10_001, "action_id": "a"}, "batch_size"),
    ):
        status, shown = answer(await functions.outbox_requeue(post("outbox/requeue", body)))
        assert status == 400, (body, shown)
        assert named in shown["error"], (body, shown)
    assert await db.fetchval("SELECT count(*) FROM outbox_messages WHERE status = 'Failed'") == 1


async def test_pause_and_resume_are_persisted_checked_and_recorded(db: Any, app_env: None) -> None:
    bad = answer(
        await functions.outbox_pause(post("outbox/pause", {"event_type": "X", "endpoint": "y"}))
    )
    assert bad == (404, {"error": "no endpoint of event type 'X' (configured: OrderCompleted)"})
    key = {"event_type": "OrderCompleted", "endpoint": "OrderCompleted"}
    assert answer(await functions.outbox_pause(post("outbox/pause", key)))[0] == 200
    overview = answer(await functions.outbox_overview(get("outbox/overview")))[1]
    assert [(p["event_type"], p["endpoint"]) for p in overview["paused_endpoints"]] == [
        ("OrderCompleted", "OrderCompleted")
    ]
    resumed = answer(await functions.outbox_resume(post("outbox/resume", key)))[1]
    assert resumed["changed"] is True
    assert await db.fetchval("SELECT count(*) FROM outbox_paused_endpoints") == 0
    actions = answer(await functions.outbox_actions(get("outbox/actions")))[1]["actions"]
    assert sorted(a["action"] for a in actions) == ["pause", "resume"]


def test_message_query_flags_name_the_flag() -> None:
    with pytest.raises(BadRequestError, match=r"^--status must be one of"):
        parse_message_query({"status": "nope"}, MESSAGE_FLAGS)


async def test_a_paused_endpoint_waits_spending_no_attempt_while_the_other_receives(
    db: Any, make_settings: Any, receiver: Receiver
) -> None:
    settings = make_settings(
        webhooks={
            "OrderCompleted": [
                {"name": "billing", "url": receiver.url("/billing"), "secret": SECRET},
                {"name": "shipping", "url": receiver.url("/shipping"), "secret": SECRET},
            ]
        }
    )
    await actions.pause(db, ("OrderCompleted", "shipping"), actor="key:test")
    ids = await seed(db, 3)
    async with open_relay(settings) as relay:
        await relay.drain(10)
        await relay.drain(10)  # the second lease has read the pause for certain
        assert len(receiver.to("/billing")) == 3
        assert receiver.to("/shipping") == []
        waiting = await db.fetch(
            "SELECT status, endpoint_state FROM outbox_messages WHERE outbox_message_id = ANY($1)",
            ids,
        )
        assert {r["status"] for r in waiting} == {"Pending"}
        for r in waiting:
            state = json.loads(r["endpoint_state"])
            assert state["shipping"]["status"] == "Pending"
            assert state["shipping"]["attempts"] == 0  # waiting spent no attempt
        resumed = await actions.resume(db, ("OrderCompleted", "shipping"), actor="key:test")
        assert resumed["due"] == 3
        await relay.drain(10)
    assert len(receiver.to("/shipping")) == 3
    assert len(receiver.to("/billing")) == 3
    assert await statuses(db) == {"Processed": 3}
    configured = {"OrderCompleted": ["billing", "shipping"]}
    health = {e["endpoint"]: e for e in await views.endpoint_health(db, configured)}
    assert (health["billing"]["attempts_last_hour"], health["shipping"]["attempts_last_hour"]) == (
        3,
        3,
    )
    assert health["billing"]["failure_rate_last_hour"] == 0.0
    assert health["billing"]["last_success"] is not None
    assert health["shipping"]["paused"] is False


async def test_the_commands_list_pause_resume_endpoints_and_requeue_by_error_text(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
    }
    timeouts = await failed(db, 2, "HTTP 504: gateway\x1b[31m timeout")
    await failed(db, 1, "HTTP 400: bad")
    listed = await run_cli("list", "--status", "Failed", "--error", "504", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert sorted(m["outbox_message_id"] for m in page["messages"]) == sorted(map(str, timeouts))
    text = await run_cli("list", "--status", "Failed", "--limit", "1", env=env)
    assert "\x1b" not in text.stdout  # a receiver's text cannot forge the terminal's output
    assert "more: --after " in text.stdout
    bad = await run_cli("list", "--created-from", "noon", env=env)
    assert (bad.returncode, "--created-from must be an ISO 8601 time" in bad.stderr) == (2, True)
    dry = await run_cli("requeue", "--error", "504", "--dry-run", env=env)
    assert json.loads(dry.stdout)["requeued"] == 2
    done = await run_cli("requeue", "--error", "504", "--yes", env=env)
    assert json.loads(done.stdout)["requeued"] == 2
    paused = await run_cli("pause", "OrderCompleted", "OrderCompleted", env=env)
    assert json.loads(paused.stdout)["paused"] is True
    health = json.loads((await run_cli("endpoints", env=env)).stdout)["endpoints"]
    assert health == [
        {
            "event_type": "OrderCompleted",
            "endpoint": "OrderCompleted",
            "breaker": "closed",
            "consecutive_failures": 0,
            "paused": True,
            "last_success": None,
            "last_failure": None,
            "attempts_last_hour": 0,
            "failure_rate_last_hour": None,
        }
    ]
    unknown = await run_cli("pause", "OrderCompleted", "nowhere", env=env)
    assert (unknown.returncode, "no endpoint 'nowhere'" in unknown.stderr) == (1, True)
    resumed = await run_cli("resume", "OrderCompleted", "OrderCompleted", env=env)
    assert json.loads(resumed.stdout)["paused"] is False
    recorded = await db.fetch(
        "SELECT action, actor FROM outbox_console_actions ORDER BY created_at"
    )
    assert [(r["action"], r["actor"]) for r in recorded] == [
        ("requeue", "cli"),
        ("pause", "cli"),
        ("resume", "cli"),
    ]
