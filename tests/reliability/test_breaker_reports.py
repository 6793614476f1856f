"""Breakers reported as they are: open while the cool-down runs, half-open once it has passed with
a message waiting (its next delivery is the probe), closed once it has passed with nothing
waiting, in ``status`` and ``endpoints`` and in the console, never open for ever."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import azure.functions as func

from outbox.azure import functions
from outbox.relay.breakers import THRESHOLD
from tests.conftest import SECRET
from tests.support.outbox_helpers import open_relay, run_cli, seed, statuses
from tests.support.receiver import Receiver, Reply

KEY = {"x-functions-key": "the-operators-key-0123"}


def get(route: str) -> Any:
    return func.HttpRequest(
        method="GET", url=f"http://localhost/api/{route}", headers=KEY, params={}, body=b""
    )


async def reported(env: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """What the CLI's status and endpoints and the console's overview say of the one endpoint:
    (status, its breaker in status, its row in endpoints), checked to agree with the console."""
    status = await run_cli("status", env=env)
    shown = json.loads(status.stdout)
    assert status.returncode == (0 if shown["healthy"] else 1), status.stderr
    [endpoint] = json.loads((await run_cli("endpoints", env=env)).stdout)["endpoints"]
    http = await functions.outbox_status(get("outbox/status"))
    overview = json.loads((await functions.outbox_overview(get("outbox/overview"))).get_body())
    assert json.loads(http.get_body())["open_breakers"] == shown["open_breakers"]
    assert overview["open_breakers"] == shown["open_breakers"]
    breakers = {b["endpoint"]: b for b in shown["open_breakers"]}
    return shown, breakers.get("OrderCompleted", {}), endpoint


async def test_a_breaker_whose_messages_all_failed_is_not_reported_open_for_ever(
    db: Any, database_url: str, receiver: Receiver, make_settings: Any, app_env: None
) -> None:
    healthy = False
    receiver.responder = lambda _: Reply(200 if healthy else 503, b"down")
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
    }
    # THRESHOLD failures in a row open the breaker; each was its message's last attempt.
    await seed(db, THRESHOLD)
    async with open_relay(make_settings(max_attempts=1)) as relay:
        await relay.drain(10)
    assert await statuses(db) == {"Failed": THRESHOLD}
    status, breaker, endpoint = await reported(env)
    assert (breaker["state"], breaker["consecutive_failures"]) == ("open", THRESHOLD)
    assert (endpoint["breaker"], endpoint["consecutive_failures"]) == ("open", THRESHOLD)
    assert status["healthy"] is True  # Failed messages are counted, not alerted on

    # Minutes later (the database's clock moved on): the cool-down has passed and nothing waits
    # for the endpoint. Nothing is held back: its next message is sent at once, as its probe.
    await db.execute(
        "UPDATE outbox_endpoints SET reopen_at = now() - interval '10 minutes', "
        "opened_at = now() - interval '11 minutes'"
    )
    status, breaker, endpoint = await reported(env)
    assert (status["healthy"], status["open_breakers"], status["problems"]) == (True, [], [])
    assert (endpoint["breaker"], endpoint["consecutive_failures"]) == ("closed", 0)

    # A message arrives: it waits for the probe that decides, and the breaker is half-open.
    [message_id] = await seed(db)
    status, breaker, endpoint = await reported(env)
    assert status["healthy"] is True
    assert (breaker["state"], breaker["probing"], breaker["consecutive_failures"]) == (
        "half-open",
        False,
        THRESHOLD,
    )
    assert datetime.fromisoformat(breaker["next_probe"]) < await db.fetchval("SELECT now()")
    assert endpoint["breaker"] == "half-open"

    # The endpoint is back: the message is the probe, delivered at once; the breaker closes.
    healthy = True
    async with open_relay(make_settings(max_attempts=1)) as relay:
        await relay.drain(10)
    assert receiver.to("/orders")[-1].webhook_id == str(message_id)
    status, breaker, endpoint = await reported(env)
    assert (status["open_breakers"], endpoint["breaker"]) == ([], "closed")
    assert await db.fetchval("SELECT count(*) FROM outbox_endpoints") == 0
