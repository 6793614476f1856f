"""Several endpoints per event type: each gets every message once it answers 2xx, with its own
state, headers and limits (real PostgreSQL, real receivers on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import azure.functions as func
import pytest

import outbox
from outbox import operations
from outbox.azure import functions
from outbox.operations.requests import RequeueFilter
from tests.conftest import SECRET
from tests.support.outbox_helpers import eventually, open_relay, row, run_cli, seed, statuses
from tests.support.receiver import Received, Receiver, Reply

LATER = {"Retry-After": "1"}


def two_endpoints(receiver: Receiver, **shipping: Any) -> dict[str, Any]:
    return {
        "OrderCompleted": [
            {"name": "billing", "url": receiver.url("/billing"), "secret": SECRET},
            {"name": "shipping", "url": receiver.url("/shipping"), **shipping},
        ]
    }


async def drain_until(relay: Any, db: Any, wanted: dict[str, int], timeout: float = 30) -> None:
    async def done() -> bool:
        await relay.processor.execute()
        return await statuses(db) == wanted

    await eventually(done, timeout)


async def test_a_message_goes_to_every_endpoint_and_a_retry_only_to_those_not_done(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/shipping", Reply(503, headers=LATER), Reply(503, headers=LATER))
    [message_id] = await seed(db)
    async with open_relay(make_settings(webhooks=two_endpoints(receiver))) as relay:
        first = await relay.processor.execute()
        assert (first.retried, await statuses(db)) == (1, {"Pending": 1})
        await drain_until(relay, db, {"Processed": 1})
    assert [r.webhook_id for r in receiver.to("/billing")] == [str(message_id)]  # exactly once
    assert [r.webhook_id for r in receiver.to("/shipping")] == [str(message_id)] * 3
    assert len({r.body for r in receiver.requests}) == 1  # the same body to both
    history = await db.fetch(
        "SELECT endpoint, attempt_number, outcome FROM outbox_attempts ORDER BY attempt_id"
    )
    by_endpoint = {(r["endpoint"], r["attempt_number"], r["outcome"]) for r in history}
    assert by_endpoint == {
        ("billing", 1, "Processed"),
        ("shipping", 1, "Pending"),
        ("shipping", 2, "Pending"),
        ("shipping", 3, "Processed"),
    }
    shown = await operations.show(db, message_id)
    assert shown is not None
    assert shown["endpoints"] == [
        {"endpoint": "billing", "status": "Processed", "attempts": 1, "last_error": None},
        {"endpoint": "shipping", "status": "Processed", "attempts": 3, "last_error": None},
    ]
    assert (await row(db, message_id))["endpoint_state"] is None  # nothing left to keep


async def test_a_410_fails_its_endpoint_the_others_still_get_it_and_a_requeue_resends_it(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/billing", Reply(410, b"gone"))
    [message_id] = await seed(db)
    async with open_relay(make_settings(webhooks=two_endpoints(receiver))) as relay:
        summary = await relay.processor.execute()
        assert summary.failed == 1
        stored = await row(db, message_id)
        assert (stored["status"], stored["last_error"]) == ("Failed", "billing: HTTP 410: gone")
        assert json.loads(stored["endpoint_state"]) == {
            "billing": {"status": "Failed", "attempts": 1, "error": "HTTP 410: gone"},
            "shipping": {"status": "Processed", "attempts": 1},
        }
        other = RequeueFilter(endpoint="shipping")
        assert (await operations.requeue(db, other, dry_run=False)).requeued == 0
        wanted = RequeueFilter(endpoint="billing")
        assert (await operations.requeue(db, wanted, dry_run=False)).requeued == 1
        await relay.processor.execute()
    assert await statuses(db) == {"Processed": 1}
    assert len(receiver.to("/billing")) == 2
    assert len(receiver.to("/shipping")) == 1  # it had it: not sent again


async def test_a_later_message_of_a_key_waits_until_the_earlier_one_is_done_everywhere(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    accepted: list[tuple[str, int]] = []
    out_of_order: list[tuple[str, int]] = []
    shipping_failed = asyncio.Event()

    def answer(request: Received) -> Reply:
        n = request.json["data"]["n"]
        if request.path == "/shipping" and n == 0 and not shipping_failed.is_set():
            shipping_failed.set()
            return Reply(503, headers=LATER)
        if n == 1 and (("/shipping", 0) not in accepted or ("/billing", 0) not in accepted):
            out_of_order.append((request.path, n))
        accepted.append((request.path, n))
        return Reply(200)

    receiver.responder = answer
    async with db.transaction():
        for n in range(2):
            await outbox.enqueue(db, "OrderCompleted", {"n": n}, ordering_key="order-1")
    async with open_relay(make_settings(webhooks=two_endpoints(receiver))) as relay:
        await drain_until(relay, db, {"Processed": 2})
    assert shipping_failed.is_set()
    assert out_of_order == []
    assert sorted(accepted) == [
        ("/billing", 0),
        ("/billing", 1),
        ("/shipping", 0),
        ("/shipping", 1),
    ]


async def test_header_values_are_sent_and_appear_in_no_output_or_table(
    db: Any, receiver: Receiver, make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token, key = "Bearer sk-partner-7Hq2Lm9Xa4", "apikey-0b5e2c9d71"
    headers = {"Authorization": token, "X-Api-Key": key}
    # A receiver that echoes the request's headers in its error page.
    receiver.responder = lambda request: Reply(500, json.dumps(request.headers).encode())
    [message_id] = await seed(db)
    webhooks = two_endpoints(receiver, headers=headers)
    async with open_relay(make_settings(webhooks=webhooks)) as relay:
        await relay.processor.execute()
        status = await operations.backlog_status(relay.pool, 900)
    [shipped] = receiver.to("/shipping")
    assert (shipped.headers["authorization"], shipped.headers["x-api-key"]) == (token, key)
    assert "authorization" not in receiver.to("/billing")[0].headers  # its own headers only
    tables = await db.fetch("SELECT * FROM outbox_messages")
    tables += await db.fetch("SELECT * FROM outbox_attempts")
    shown = json.dumps(await operations.show(db, message_id), default=str)
    everything = [
        ("the tables", repr([dict(r) for r in tables])),
        ("show", shown),
        ("status", json.dumps(status.as_dict())),
        ("the logs", caplog.text),
        ("log arguments", "\n".join(repr(r.args) for r in caplog.records)),
    ]
    assert "[redacted]" in shown
    for where, text in everything:
        for secret in (token, "sk-partner-7Hq2Lm9Xa4", key):
            assert secret not in text, f"{secret!r} in {where}"


async def test_an_endpoint_s_own_timeout_and_concurrency_apply_to_it_alone(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    release = asyncio.Event()
    receiver.script("/shipping", then=Reply(200, hold=release))
    await seed(db, 6)
    webhooks = two_endpoints(receiver, max_concurrency=2, timeout_seconds=2)
    async with open_relay(make_settings(webhooks=webhooks, concurrency=8)) as relay:
        drain = asyncio.create_task(relay.processor.execute())
        await receiver.wait_for(6, path="/billing")  # the healthy endpoint is not held up
        await receiver.wait_for(2, path="/shipping")
        assert receiver.in_flight == 2  # shipping: at most two at once
        summary = await drain  # the held requests time out after shipping's own 2 s
    assert summary.retried == 6
    errors = await db.fetch(
        "SELECT DISTINCT error FROM outbox_attempts WHERE endpoint = 'shipping'"
    )
    assert {r["error"] for r in errors} <= {"timed out after 2s", None}
    release.set()


async def test_rows_of_the_single_endpoint_form_carry_on_after_a_list_replaces_it(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", Reply(503, headers=LATER))
    [retrying] = await seed(db)
    single = {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
    async with open_relay(make_settings(webhooks=single)) as relay:
        await relay.processor.execute()
    [delivered] = await seed(db)
    async with open_relay(make_settings(webhooks=single)) as relay:
        await relay.processor.execute()
    assert (await row(db, delivered))["status"] == "Processed"
    # The same endpoint, now named in a list, and a second one.
    webhooks = {
        "OrderCompleted": [
            {"name": "OrderCompleted", "url": receiver.url("/orders"), "secret": SECRET},
            {"name": "audit", "url": receiver.url("/audit")},
        ]
    }
    await asyncio.sleep(1.1)  # the retry's Retry-After
    async with open_relay(make_settings(webhooks=webhooks)) as relay:
        await relay.processor.execute()
    assert await statuses(db) == {"Processed": 2}
    assert [r.webhook_id for r in receiver.to("/audit")] == [str(retrying)]  # not the done one
    to_orders = [r.webhook_id for r in receiver.to("/orders")]
    assert to_orders == [str(retrying), str(delivered), str(retrying)]


async def test_requeue_of_one_endpoint_by_command_and_http_and_of_rows_kept_from_before(
    db: Any, database_url: str, app_env: None
) -> None:
    ids = await seed(db, 3)
    state = {
        "billing": {"status": "Failed", "attempts": 10, "error": "HTTP 500"},
        "shipping": {"status": "Processed", "attempts": 1},
    }
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', attempt_count = 10, endpoint_state = $2 "
        "WHERE outbox_message_id = ANY ($1::uuid[])",
        ids[:2],
        json.dumps(state),
    )
    # Failed before endpoints had state of their own: at the one endpoint, named after its type.
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', attempt_count = 10 "
        "WHERE outbox_message_id = $1",
        ids[2],
    )
    env = {"OUTBOX_DATABASE_URL": database_url}
    shipping = await run_cli("requeue", "--endpoint", "shipping", "--dry-run", env=env)
    assert (shipping.returncode, json.loads(shipping.stdout)["requeued"]) == (0, 0), shipping.stderr
    billing = await run_cli("requeue", "--endpoint", "billing", "--yes", env=env)
    assert json.loads(billing.stdout)["requeued"] == 2, billing.stderr
    kept = await row(db, ids[0])
    assert kept["status"] == "Pending"
    assert json.loads(kept["endpoint_state"]) == {
        "billing": {"status": "Pending", "attempts": 0},
        "shipping": {"status": "Processed", "attempts": 1},  # it will not be sent it again
    }
    body = json.dumps({"endpoint": "OrderCompleted"}).encode()
    request = func.HttpRequest(
        method="POST", url="/api/outbox/requeue", headers={}, params={}, body=body
    )
    response = await functions.outbox_requeue(request)
    assert (response.status_code, json.loads(response.get_body())["requeued"]) == (200, 1)
    assert await statuses(db) == {"Pending": 3}


async def drain_due(relay: Any, db: Any) -> None:
    """One run with every Pending message due now (their backoff skipped)."""
    await db.execute("UPDATE outbox_messages SET next_attempt_at = now() WHERE status = 'Pending'")
    await relay.processor.execute()


async def history(db: Any) -> list[tuple[str, int, str]]:
    rows = await db.fetch(
        "SELECT endpoint, attempt_number, outcome FROM outbox_attempts ORDER BY attempt_id"
    )
    return [(r["endpoint"], r["attempt_number"], r["outcome"]) for r in rows]


async def test_a_renamed_endpoint_gets_the_message_from_its_first_attempt_and_every_attempt(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/orders", then=Reply(503))
    receiver.script("/v2", then=Reply(503))
    [message_id] = await seed(db)
    old = {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
    async with open_relay(make_settings(webhooks=old)) as relay:
        for _ in range(9):
            await drain_due(relay, db)
    assert (await row(db, message_id))["attempt_count"] == 9  # one more, and it would fail
    # "Renaming an endpoint makes it a new one": sent the message from its first attempt.
    renamed = {"OrderCompleted": [{"name": "orders-v2", "url": receiver.url("/v2")}]}
    async with open_relay(make_settings(webhooks=renamed)) as relay:
        await drain_due(relay, db)
        assert (await row(db, message_id))["status"] == "Pending"
        for _ in range(9):
            await drain_due(relay, db)
    stored = await row(db, message_id)
    assert stored["status"] == "Failed"
    assert stored["last_error"] == "gave up after 10 attempts: HTTP 503: ok"
    assert len(receiver.to("/orders")) == 9
    assert len(receiver.to("/v2")) == 10
    assert [n for name, n, _ in await history(db) if name == "orders-v2"] == list(range(1, 11))


async def test_an_endpoint_added_to_an_event_type_starts_at_its_first_attempt(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    receiver.script("/billing", then=Reply(503))
    receiver.script("/shipping", then=Reply(503))
    [message_id] = await seed(db)
    one = {"OrderCompleted": [{"name": "billing", "url": receiver.url("/billing")}]}
    async with open_relay(make_settings(webhooks=one, max_attempts=4)) as relay:
        for _ in range(3):
            await drain_due(relay, db)
    both = {
        "OrderCompleted": [
            {"name": "billing", "url": receiver.url("/billing")},
            {"name": "shipping", "url": receiver.url("/shipping")},
        ]
    }
    async with open_relay(make_settings(webhooks=both, max_attempts=4)) as relay:
        await drain_due(relay, db)
        # billing spent its fourth and last attempt; shipping its first of four.
        assert (await row(db, message_id))["status"] == "Pending"
        assert json.loads((await row(db, message_id))["endpoint_state"]) == {
            "billing": {
                "status": "Failed",
                "attempts": 4,
                "error": "gave up after 4 attempts: HTTP 503: ok",
            },
            "shipping": {"status": "Pending", "attempts": 1, "error": "HTTP 503: ok"},
        }
        for _ in range(3):
            await drain_due(relay, db)
    assert (await row(db, message_id))["status"] == "Failed"
    assert len(receiver.to("/billing")) == 4
    assert len(receiver.to("/shipping")) == 4
    assert sorted((name, n) for name, n, _ in await history(db)) == [
        ("billing", 1),
        ("billing", 2),
        ("billing", 3),
        ("billing", 4),
        ("shipping", 1),
        ("shipping", 2),
        ("shipping", 3),
        ("shipping", 4),
    ]
