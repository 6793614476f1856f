"""Payloads SQL stores and ``enqueue`` refuses (jsonb nested thousands deep, a number of thousands
of digits): the relay delivers them, and ``show``, ``list`` and the console's detail and list show
what the database holds, as its text where Python cannot decode it, never a traceback."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

import azure.functions as func

from outbox.azure import functions
from tests.conftest import SECRET
from tests.support.outbox_helpers import run_cli
from tests.support.receiver import Receiver

DEEP = 3000
DIGITS = 5000
KEY = {"x-functions-key": "the-operators-key-0123"}


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


async def stored_by_sql(db: Any) -> dict[str, uuid.UUID]:
    """The two payloads, written as any SQL client could, and committed."""
    written = {}
    for name, payload in [
        ("deep", '{"a": ' + "[" * DEEP + "]" * DEEP + "}"),
        ("long_number", '{"n": ' + "9" * DIGITS + "}"),
    ]:
        written[name] = await db.fetchval(
            "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
            "VALUES (gen_random_uuid(), 'OrderCompleted', $1::jsonb) RETURNING outbox_message_id",
            payload,
        )
    return written


async def database_text(db: Any, message_id: uuid.UUID) -> str:
    text: str = await db.fetchval(
        "SELECT payload::text FROM outbox_messages WHERE outbox_message_id = $1", message_id
    )
    return text


REASONS = {
    "deep": "nested deeper than Python's JSON decoder follows",
    "long_number": "a number of more than 4300 digits",
}


async def test_show_and_list_print_payloads_python_cannot_decode_as_the_database_s_text(
    db: Any, database_url: str, receiver: Receiver
) -> None:
    written = await stored_by_sql(db)
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
    }
    drained = await run_cli("drain", env=env)
    assert drained.returncode == 0, drained.stderr
    assert sorted(r.webhook_id for r in receiver.to("/orders")) == sorted(
        str(i) for i in written.values()
    )  # the relay delivers both
    for name, message_id in written.items():
        result = await run_cli("show", str(message_id), env=env)
        assert (result.returncode, result.stderr) == (0, ""), name
        shown = json.loads(result.stdout)
        assert shown["status"] == "Processed"
        assert shown["payload"] == await database_text(db, message_id)
        assert shown["payload_as_text"].startswith("payload shown as the database's text")
        assert REASONS[name] in shown["payload_as_text"]
        assert len(shown["attempts"]) == 1
    listed = await run_cli("list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(m["outbox_message_id"] for m in json.loads(listed.stdout)["messages"]) == sorted(
        str(i) for i in written.values()
    )
    table = await run_cli("list", env=env)
    assert table.returncode == 0, table.stderr
    assert all(str(i) in table.stdout for i in written.values())


async def test_the_console_s_detail_and_list_show_payloads_python_cannot_decode(
    db: Any, app_env: None
) -> None:
    written = await stored_by_sql(db)
    [plain] = [
        await db.fetchval(
            "INSERT INTO outbox_messages (outbox_message_id, event_type, payload) "
            "VALUES (gen_random_uuid(), 'OrderCompleted', '{\"orderId\": 1}') "
            "RETURNING outbox_message_id"
        )
    ]
    for name, message_id in written.items():
        response = await functions.outbox_message(
            get("outbox/messages/x", message_id=str(message_id))
        )
        assert response.status_code == 200, name
        detail = json.loads(response.get_body())
        assert detail["payload"] == await database_text(db, message_id)
        assert detail["payload_truncated"] is False
        assert REASONS[name] in detail["payload_as_text"]
    response = await functions.outbox_message(get("outbox/messages/x", message_id=str(plain)))
    detail = json.loads(response.get_body())
    assert (json.loads(detail["payload"]), detail["payload_as_text"]) == ({"orderId": 1}, None)
    listed = await functions.outbox_messages(get("outbox/messages"))
    assert listed.status_code == 200
    assert {m["outbox_message_id"] for m in json.loads(listed.get_body())["messages"]} == {
        str(i) for i in [*written.values(), plain]
    }
