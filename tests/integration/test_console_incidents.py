"""The console an operator reaches for in an incident (issue 44), through its Functions as the
worker calls them, against a real PostgreSQL and a real receiver: health first, a message by
id with what holds it and its whole payload, the endpoints' health, cancel, replay and a probe
now, the record of actions paged and filtered with who acted from where, and every bad
parameter a 400 naming it."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import azure.functions as func
import pytest
from aiohttp import test_utils

import outbox
from outbox.azure import functions
from outbox.hosting import serve
from outbox.operations import replay_window
from tests.conftest import SECRET
from tests.support.outbox_helpers import row, seed, statuses
from tests.support.receiver import Receiver, Reply

KEY = {"x-functions-key": "the-operators-key-0123"}
KIND = "OrderCompleted"


def get(route: str, params: dict[str, str] | None = None, **route_params: str) -> Any:
    query = urlencode(params or {})
    return func.HttpRequest(
        method="GET",
        url=f"http://localhost/api/{route}" + (f"?{query}" if query else ""),
        headers=KEY,
        params=params or {},
        route_params=route_params,
        body=b"",
    )


def post(
    route: str, body: dict[str, Any], headers: dict[str, str] | None = None, query: str = ""
) -> Any:
    return func.HttpRequest(
        method="POST",
        url=f"http://localhost/api/{route}" + (f"?{query}" if query else ""),
        headers=KEY | (headers or {}),
        params={},
        body=json.dumps(body).encode(),
    )


def answer(response: func.HttpResponse) -> tuple[int, Any]:
    return response.status_code, json.loads(response.get_body())


async def set_status(db: Any, ids: list[uuid.UUID], status: str, error: str | None = None) -> None:
    await db.execute(
        "UPDATE outbox_messages SET status = $2, last_error = $3, "
        "processed_at = CASE WHEN $2 = 'Processed' THEN now() END "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids,
        status,
        error,
    )


async def test_the_overview_says_healthy_or_not_and_why_and_who_the_caller_is(
    db: Any, app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_ALERT_OLDEST_PENDING_SECONDS", "60")
    [old] = await seed(db, 1)
    await db.execute(
        "UPDATE outbox_messages SET created_at = now() - interval '2 hours' "
        "WHERE outbox_message_id = $1",
        old,
    )
    principal = base64.b64encode(
        json.dumps(
            {"name_typ": "name", "claims": [{"typ": "name", "val": "ada@example.com"}]}
        ).encode()
    ).decode()
    request = get("outbox/overview")
    request = func.HttpRequest(
        method="GET",
        url=request.url,
        headers=KEY | {"X-MS-CLIENT-PRINCIPAL": principal},
        body=b"",
    )
    response = await functions.outbox_overview(request)
    status, body = answer(response)
    assert status == 200
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Cache-Control"] == "no-store"
    health = body["health"]
    assert (health["healthy"], health["alert_threshold_seconds"]) == (False, 60.0)
    assert health["oldest_unpublished_age_seconds"] > 7000
    assert "oldest unpublished message is" in health["problems"][0]
    assert (body["can_act"], body["actor"]) == (True, "ada@example.com")
    plain = answer(await functions.outbox_overview(get("outbox/overview")))[1]
    assert plain["actor"] == "function key"  # the Functions host checked a key, and says no more


async def test_a_message_page_says_what_holds_it_and_each_attempt_s_own_outcome(
    db: Any, app_env: None, receiver: Receiver
) -> None:
    async with db.transaction():
        first = await outbox.enqueue(db, "OrderCompleted", {"n": 1}, ordering_key="order-7")
        second = await outbox.enqueue(db, "OrderCompleted", {"n": 2}, ordering_key="order-7")
    receiver.script("/orders", Reply(503, b"busy"), then=Reply(200))
    await functions.outbox_drain(post("outbox/drain", {}))
    shown = answer(await functions.outbox_message(get("outbox/messages/x", message_id=str(second))))
    assert shown[1]["held_behind"] == str(first)
    head = answer(await functions.outbox_message(get("outbox/messages/x", message_id=str(first))))
    assert head[1]["status"] == "Pending"  # the row is Pending; its one attempt was a retry
    [attempt] = head[1]["attempts"]
    assert (attempt["outcome"], attempt["http_status"], attempt["endpoint"]) == (
        "retry",
        503,
        "OrderCompleted",
    )
    assert attempt["response_snippet"] == "busy"
    assert isinstance(attempt["duration_ms"], int)
    assert "error_class" in attempt
    assert head[1]["held_behind"] is None
    [lost] = await seed(db, 1, "NoSuchType")  # no endpoint: failed without a request
    await functions.outbox_drain(post("outbox/drain", {}))
    unsent = answer(await functions.outbox_message(get("outbox/messages/x", message_id=str(lost))))
    assert [a["outcome"] for a in unsent[1]["attempts"]] == ["not sent"]


async def test_a_whole_payload_downloads_and_unknown_or_bad_ids_are_named(
    db: Any, app_env: None
) -> None:
    big = "é" * 150_000
    [message_id] = await seed(db, 1, payload=lambda i: {"note": big, "tag": "<b>x</b>"})
    detail = answer(
        await functions.outbox_message(get("outbox/messages/x", message_id=str(message_id)))
    )[1]
    assert detail["payload_truncated"] is True
    response = await functions.outbox_message(
        get("outbox/messages/x", {"payload": "full"}, message_id=str(message_id))
    )
    assert (response.status_code, response.mimetype) == (200, "application/json")
    assert response.headers["Content-Disposition"] == (f'attachment; filename="{message_id}.json"')
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert json.loads(response.get_body()) == {"note": big, "tag": "<b>x</b>"}
    unknown = uuid.uuid4()
    for params in ({}, {"payload": "full"}):
        missing = await functions.outbox_message(
            get("outbox/messages/x", params, message_id=str(unknown))
        )
        assert answer(missing) == (404, {"error": f"no outbox message {unknown}"})
    bad = await functions.outbox_message(get("outbox/messages/x", message_id="nope"))
    assert answer(bad)[0] == 400
    assert "message_id" in answer(bad)[1]["error"]
    half = await functions.outbox_message(
        get("outbox/messages/x", {"payload": "half"}, message_id=str(message_id))
    )
    assert answer(half)[0] == 400
    assert answer(half)[1]["error"].startswith("payload must be full")


async def test_a_malformed_cursor_is_a_400_naming_it_never_a_503(db: Any, app_env: None) -> None:
    await seed(db, 1)
    for after in (
        f"0001-01-01T00:00:00+14:00_{uuid.uuid4()}",
        f"2026-01-01T00:00:00_{uuid.uuid4()}",
    ):
        response = await functions.outbox_messages(get("outbox/messages", {"after": after}))
        assert answer(response) == (
            400,
            {"error": "after must be the cursor a previous page gave"},
        )
    for before in (
        "nope",
        "WyJ4Il0",
        base64.urlsafe_b64encode(b'["0001-01-01T00:00:00+14:00", "a"]'),
    ):
        text = before if isinstance(before, str) else before.decode()
        response = await functions.outbox_actions(get("outbox/actions", {"before": text}))
        status, body = answer(response)
        assert (status, body["error"].startswith("before must be the cursor")) == (400, True)


async def test_the_endpoints_page_shows_each_endpoint_s_state_host_and_rates(
    db: Any, app_env: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhooks = {
        "OrderCompleted": [
            {"name": "billing", "url": receiver.url("/billing?token=s3cret"), "secret": SECRET},
            {"name": "shipping", "url": receiver.url("/shipping"), "secret": SECRET},
            {"name": "audit", "url": "https://eo5f1c2a9b8d7e6x.m.pipedream.net/in?k=s3cret"},
        ]
    }
    monkeypatch.setenv("OUTBOX_WEBHOOKS", json.dumps(webhooks))
    await db.execute(
        "INSERT INTO outbox_endpoints (event_type, endpoint, consecutive_failures, opens, "
        "opened_at, reopen_at) VALUES ('OrderCompleted', 'shipping', 12, 1, now(), "
        "now() + interval '5 minutes'), ('OrderCompleted', 'billing', 3, 0, NULL, NULL)"
    )
    key = {"event_type": "OrderCompleted", "endpoint": "audit"}
    pause = await functions.outbox_pause(post("outbox/pause", key, {"User-Agent": "ops-cli"}))
    assert pause.status_code == 200
    body = answer(await functions.outbox_endpoints(get("outbox/endpoints")))[1]
    shown = {e["endpoint"]: e for e in body["endpoints"]}
    assert {n: e["state"] for n, e in shown.items()} == {
        "billing": "healthy",
        "shipping": "open",
        "audit": "paused",
    }
    assert (shown["billing"]["url_host"], shown["billing"]["failures"]) == ("127.0.0.1", 3)
    assert shown["audit"]["url_host"] == "[redacted].m.pipedream.net"
    assert "s3cret" not in json.dumps(body)
    assert shown["shipping"]["failures"] == 12
    assert shown["shipping"]["breaker_since"] is not None
    assert shown["shipping"]["next_probe"] > datetime.now(UTC).isoformat()
    assert (shown["audit"]["paused_by"], shown["audit"]["paused_at"] is not None) == (
        "function key",
        True,
    )
    assert shown["billing"]["delivered_per_minute"] == 0.0
    assert shown["billing"]["attempts_last_hour"] == 0


async def test_cancel_fails_pending_messages_with_who_and_why_and_skips_the_rest(
    db: Any, app_env: None
) -> None:
    pending, leased, done = await seed(db, 3)
    await set_status(db, [leased], "Processing")
    await set_status(db, [done], "Processed")
    ids = [str(pending), str(leased), str(done)]
    body = {"message_ids": ids, "reason": "partner asked to drop <these>"}
    dry = answer(await functions.outbox_cancel(post("outbox/cancel", body | {"dry_run": True})))
    assert dry[1]["would_cancel"] == [str(pending)]
    assert await statuses(db) == {"Pending": 1, "Processing": 1, "Processed": 1}
    headers = {"X-Forwarded-For": "203.0.113.9:50112, 10.0.0.1", "User-Agent": "curl/8"}
    status, result = answer(await functions.outbox_cancel(post("outbox/cancel", body, headers)))
    assert status == 200
    assert result["cancelled"] == [str(pending)]
    assert result["skipped"] == [str(leased), str(done)]
    assert "being delivered now" in result["why_skipped"][str(leased)]
    assert "Processed already" in result["why_skipped"][str(done)]
    cancelled = await row(db, pending)
    assert cancelled["status"] == "Failed"
    assert cancelled["last_error"] == "cancelled by function key: partner asked to drop <these>"
    [recorded] = await db.fetch(
        "SELECT actor, address, user_agent, finished_at FROM outbox_console_actions "
        "WHERE action = 'cancel'"
    )
    assert (recorded["actor"], recorded["address"], recorded["user_agent"]) == (
        "function key",
        "203.0.113.9",
        "curl/8",
    )
    assert recorded["finished_at"] is not None
    # A requeue sends it after all: a cancel keeps the four statuses' contract.
    requeued = answer(
        await functions.outbox_requeue(post("outbox/requeue", {"message_ids": [str(pending)]}))
    )
    assert requeued[1]["requeued"] == 1
    for wrong, named in (
        ({"message_ids": ids}, "reason"),
        ({"message_ids": ids, "reason": "x" * 201}, "reason"),
        ({"message_ids": ["nope"], "reason": "x"}, "message_ids"),
        ({"message_ids": ids, "reason": "x", "dry_run": "yes"}, "dry_run"),
    ):
        refused = answer(await functions.outbox_cancel(post("outbox/cancel", wrong)))
        assert (refused[0], refused[1]["error"].startswith(named)) == (400, True), refused
    unknown = str(uuid.uuid4())
    missing = answer(
        await functions.outbox_cancel(
            post("outbox/cancel", {"message_ids": [unknown], "reason": "x"})
        )
    )
    assert missing == (404, {"error": f"no outbox message {unknown}"})


async def test_a_cancel_under_release_lets_the_next_message_of_its_key_go(
    db: Any, app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_ORDERING_ON_FAILURE", "release")
    async with db.transaction():
        first = await outbox.enqueue(db, "OrderCompleted", {"n": 1}, ordering_key="k")
        second = await outbox.enqueue(db, "OrderCompleted", {"n": 2}, ordering_key="k")
    await db.execute(
        "UPDATE outbox_messages SET next_attempt_at = 'infinity' WHERE outbox_message_id = $1",
        second,
    )
    body = {"message_ids": [str(first)], "reason": "poison"}
    result = answer(await functions.outbox_cancel(post("outbox/cancel", body)))[1]
    assert (result["cancelled"], result["released"]) == ([str(first)], 1)
    assert await db.fetchval(
        "SELECT next_attempt_at <= now() FROM outbox_messages WHERE outbox_message_id = $1",
        second,
    )


async def test_a_replay_plans_then_resends_the_window_s_processed_messages_once(
    db: Any, app_env: None, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_window, "BATCH", 2)
    old = await seed(db, 2)
    inside = await seed(db, 5)
    await functions.outbox_drain(post("outbox/drain", {}))
    assert await statuses(db) == {"Processed": 7}
    await db.execute(
        "UPDATE outbox_messages SET created_at = now() - interval '3 days' "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        old,
    )
    window = {
        "created_from": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
        "created_to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
    }
    plan = answer(await functions.outbox_replay(post("outbox/replay", window | {"dry_run": True})))
    assert plan[0] == 200
    assert plan[1]["would_resend"] == 5
    assert set(plan[1]["sample"]) == {str(i) for i in inside}
    assert await statuses(db) == {"Processed": 7}
    body = window | {"action_id": "replay-1"}
    status, done = answer(await functions.outbox_replay(post("outbox/replay", body)))
    assert status == 200, done
    assert (done["resent"], done["total"], done["batches"], done["done"]) == (5, 5, 3, True)
    again = answer(await functions.outbox_replay(post("outbox/replay", body)))[1]
    assert (again["resent"], again["repeated"]) == (5, True)
    await functions.outbox_drain(post("outbox/drain", {}))
    ids = [r.webhook_id for r in receiver.to("/orders")]
    assert sorted(ids) == sorted([str(i) for i in old] + [str(i) for i in inside] * 2)
    recorded = answer(await functions.outbox_actions(get("outbox/actions", {"action": "replay"})))
    [action] = recorded[1]["actions"]
    assert (action["affected"], action["finished_at"] is not None) == (5, True)


async def test_a_replay_needs_a_window_bounded_in_size_and_names_unknown_endpoints(
    db: Any, app_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replay_window, "MAX_REPLAYED", 3)
    ids = await seed(db, 4)
    await set_status(db, ids, "Processed")
    window = {
        "created_from": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
        "created_to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
    }
    for body, status, said in (
        ({}, 400, "created_from and created_to are required"),
        ({"created_from": window["created_from"]}, 400, "created_from and created_to"),
        (window | {"created_to": "2000-01-01T00:00:00Z"}, 400, "created_from must be earlier"),
        (window | {"colour": "red"}, 400, "unknown field(s) in the body: colour"),
        (window, 400, "the window holds 4 Processed messages; a replay resends at most 3"),
        (window | {"event_type": "Nope"}, 404, "no endpoint of event type 'Nope'"),
        (window | {"endpoint": "nowhere"}, 404, "no endpoint 'nowhere'"),
    ):
        refused = answer(await functions.outbox_replay(post("outbox/replay", body)))
        assert (refused[0], said in refused[1]["error"]) == (status, True), refused
    assert await statuses(db) == {"Processed": 4}
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 0


async def test_probe_now_makes_an_open_breaker_s_messages_due_and_its_answer_closes_it(
    db: Any, app_env: None, receiver: Receiver
) -> None:
    key = {"event_type": "OrderCompleted"}
    closed = answer(await functions.outbox_probe(post("outbox/probe", key)))
    assert closed[0] == 409
    assert closed[1]["error"].endswith(
        "has no open breaker: its messages are sent as they come due"
    )
    unknown = answer(
        await functions.outbox_probe(post("outbox/probe", key | {"endpoint": "nowhere"}))
    )
    assert unknown == (
        404,
        {
            "error": "no endpoint 'nowhere' of event type 'OrderCompleted' (configured: "
            + KIND
            + ")"
        },
    )
    ids = await seed(db, 3)
    await db.execute(
        "INSERT INTO outbox_endpoints (event_type, endpoint, consecutive_failures, opens, "
        "opened_at, reopen_at) VALUES ('OrderCompleted', 'OrderCompleted', 10, 3, now(), "
        "now() + interval '5 minutes')"
    )
    await db.execute(
        "UPDATE outbox_messages SET next_attempt_at = now() + interval '5 minutes' "
        "WHERE outbox_message_id = ANY($1::uuid[])",
        ids,
    )
    status, probed = answer(await functions.outbox_probe(post("outbox/probe", key)))
    assert (status, probed["probe_due"], probed["due"]) == (200, True, 3)
    await functions.outbox_drain(post("outbox/drain", {}))
    assert len(receiver.to("/orders")) == 3
    assert await statuses(db) == {"Processed": 3}
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints") == 0  # closed
    [action] = answer(await functions.outbox_actions(get("outbox/actions", {"action": "probe"})))[
        1
    ]["actions"]
    assert action["result"] == {"probe_due": True, "due": 3}


async def test_acting_with_the_key_in_the_address_is_refused_and_does_nothing(
    db: Any, app_env: None
) -> None:
    [message_id] = await seed(db, 1)
    refused = "send the key in the x-functions-key header, not in the address"
    key = {"event_type": "OrderCompleted"}
    for function, route, body in (
        (functions.outbox_pause, "outbox/pause", key),
        (functions.outbox_probe, "outbox/probe", key),
        (
            functions.outbox_cancel,
            "outbox/cancel",
            {"message_ids": [str(message_id)], "reason": "x"},
        ),
        (functions.outbox_resend, "outbox/resend", {"message_ids": [str(message_id)]}),
        (functions.outbox_requeue, "outbox/requeue", {"all_failed": True}),
        (functions.outbox_drain, "outbox/drain", {}),
    ):
        response = await function(post(route, body, query="code=the-operators-key-0123"))
        assert answer(response) == (400, {"error": refused}), route
    assert await statuses(db) == {"Pending": 1}
    assert await db.fetchval("SELECT count(*) FROM outbox_paused_endpoints") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 0
    reading = await functions.outbox_overview(get("outbox/overview", {"code": "k"}))
    assert reading.status_code == 200  # reading routes still take ?code=


async def test_the_record_of_actions_is_paged_filtered_and_names_who_acted_from_where(
    db: Any, app_env: None
) -> None:
    key = {"event_type": "OrderCompleted"}
    for n in range(6):
        agent = {"User-Agent": f"bot-{n}\x1b[31m" + "x" * 300, "X-Forwarded-For": f"198.51.100.{n}"}
        route, function = (
            ("outbox/pause", functions.outbox_pause)
            if n % 2 == 0
            else ("outbox/resume", functions.outbox_resume)
        )
        assert (await function(post(route, key, agent))).status_code == 200
    drained = await functions.outbox_drain(post("outbox/drain", {}))
    assert drained.status_code == 200
    first = answer(await functions.outbox_actions(get("outbox/actions", {"limit": "5"})))
    assert first[0] == 200
    page = first[1]
    assert [a["action"] for a in page["actions"]] == ["drain", "resume", "pause", "resume", "pause"]
    assert page["next"]
    drain = page["actions"][0]
    assert (drain["actor"], drain["filter"], drain["result"]["stopped_by"]) == (
        "function key",
        {"budget_seconds": 30.0},
        "drained",
    )
    assert drain["finished_at"] >= drain["created_at"]
    rest = answer(
        await functions.outbox_actions(
            get("outbox/actions", {"limit": "5", "before": page["next"]})
        )
    )[1]
    assert [a["action"] for a in rest["actions"]] == ["resume", "pause"]
    assert rest["next"] is None
    oldest = rest["actions"][-1]
    assert (oldest["address"], len(oldest["user_agent"])) == ("198.51.100.0", 200)
    assert oldest["user_agent"].startswith("bot-0\x1b[31m")  # kept as sent; shown escaped
    paused = answer(await functions.outbox_actions(get("outbox/actions", {"action": "pause"})))
    assert [a["action"] for a in paused[1]["actions"]] == ["pause"] * 3
    nobody = answer(await functions.outbox_actions(get("outbox/actions", {"actor": "mallory"})))
    assert nobody[1] == {"actions": [], "next": None}
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    none_since = answer(await functions.outbox_actions(get("outbox/actions", {"since": later})))
    assert none_since[1]["actions"] == []
    for params, named in (
        ({"limit": "0"}, "limit must be a whole number from 1 to 500"),
        ({"limit": "501"}, "limit must be a whole number from 1 to 500"),
        ({"action": "explode"}, "action must be one of"),
        ({"since": "yesterday"}, "since must be an ISO 8601 time"),
        ({"since": later, "until": later}, "since must be earlier than until"),
        ({"page": "2"}, "unknown parameter(s): page"),
    ):
        refused = answer(await functions.outbox_actions(get("outbox/actions", params)))
        assert (refused[0], refused[1]["error"].startswith(named)) == (400, True), refused


async def test_failure_reasons_keep_the_cause_with_what_varies_normalised(
    db: Any, app_env: None
) -> None:
    errors = [
        "HTTP 503: upstream 10.0.0.7 timed out after 5012 ms",
        "HTTP 503: upstream 10.0.0.9 timed out after 733 ms",
        "shipping: HTTP 500: order 5f1c2a9b-8d7e-4f6a-9b1c-2a9b8d7e6f5a not found",
        "shipping: HTTP 500: order 0b1c2a9b-8d7e-4f6a-9b1c-2a9b8d7e6f5a not found",
        "no endpoint configured for event type 'javascript:alert(1)' (set OUTBOX_WEBHOOKS)",
        "gave up after 3 attempts: connection reset (trace deadbeef42)",
    ]
    for error in errors:
        [message_id] = await seed(db, 1)
        await set_status(db, [message_id], "Failed", error)
    body = answer(await functions.outbox_overview(get("outbox/overview")))[1]
    reasons = {r["reason"]: r["messages"] for r in body["failure_reasons"]}
    assert reasons == {
        "HTTP 503: upstream <n>.<n>.<n>.<n> timed out after <n> ms": 2,
        "shipping: HTTP 500: order <id> not found": 2,
        "no endpoint configured for event type '…' (set OUTBOX_WEBHOOKS)": 1,
        "gave up after <n> attempts: connection reset (trace <hex>)": 1,
    }


async def test_actions_on_unknown_ids_say_so_and_a_skipped_resend_says_why(
    db: Any, app_env: None
) -> None:
    [failed] = await seed(db, 1)
    await set_status(db, [failed], "Failed", "HTTP 500")
    unknown = str(uuid.uuid4())
    for function, route, body in (
        (functions.outbox_resend, "outbox/resend", {"message_ids": [unknown]}),
        (functions.outbox_requeue, "outbox/requeue", {"message_ids": [unknown]}),
    ):
        assert answer(await function(post(route, body))) == (
            404,
            {"error": f"no outbox message {unknown}"},
        )
    status, result = answer(
        await functions.outbox_resend(post("outbox/resend", {"message_ids": [str(failed)]}))
    )
    assert (status, result["resent"], result["skipped"]) == (200, [], [str(failed)])
    assert result["why_skipped"] == {str(failed): "it is Failed, not Processed: requeue it instead"}
    elsewhere = answer(
        await functions.outbox_resend(
            post("outbox/resend", {"message_ids": [str(failed)], "endpoint": "nowhere"})
        )
    )
    assert elsewhere[0] == 404
    assert elsewhere[1]["error"].startswith("no endpoint 'nowhere' of event type 'OrderCompleted'")
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 1  # the resend


async def test_under_serve_a_named_key_is_who_acted_and_a_viewer_is_told_it_cannot_act(
    db: Any, app_env: None
) -> None:
    alice, vera = "alice-acts-key-0123456789", "vera-reads-key-0123456789"
    named = (serve.ServeKey("alice", alice, True), serve.ServeKey("vera", vera, False))
    http = [b for b in serve.index(serve.load_app()) if b.trigger["type"] == "httpTrigger"]
    app = serve.http_app(http, None, named=named)
    async with test_utils.TestServer(app) as server, test_utils.TestClient(server) as client:
        seen = await client.get("/api/outbox/overview", headers={"x-functions-key": vera})
        body = await seen.json()
        assert (body["actor"], body["can_act"]) == ("vera", False)
        assert seen.headers["Cache-Control"] == "no-store"
        paused = await client.post(
            "/api/outbox/pause",
            json={"event_type": "OrderCompleted"},
            headers={"x-functions-key": alice, "User-Agent": "console/1"},
        )
        assert paused.status == 200, await paused.text()
        refused = await client.post(
            "/api/outbox/pause",
            json={"event_type": "OrderCompleted"},
            headers={"x-functions-key": vera},
        )
        assert refused.status == 401
    [recorded] = await db.fetch("SELECT actor, address, user_agent FROM outbox_console_actions")
    assert tuple(recorded) == ("alice", "127.0.0.1", "console/1")
    assert await db.fetchval("SELECT paused_by FROM outbox_paused_endpoints") == "alice"
