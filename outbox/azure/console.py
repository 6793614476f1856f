"""The operator's console as plain async functions over plain values: its page and its JSON API.

``outbox.functions`` binds each to a route (``/api/outbox/console``, ``/api/outbox/overview``,
``/api/outbox/messages[/{message_id}]``, ``/api/outbox/actions``, ``/api/outbox/pause``,
``/api/outbox/resume``; requeue is ``/api/outbox/requeue``). Reading and acting are separate
functions, so a key can be given that reads but cannot act: on Azure a function-level key of the
read functions, under ``outbox serve`` ``OUTBOX_CONSOLE_VIEW_KEY``. The page holds no data and
needs no key: it asks the API with the key the operator gives it, in a header.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from outbox.azure.console_page import render
from outbox.azure.host import functions_host
from outbox.azure.triggers import HttpResult, Query, _json_object, http_endpoint, query_parameters
from outbox.core.errors import BadRequestError
from outbox.core.logs import log_event
from outbox.operations import actions, requests, views
from outbox.operations.list_query import MESSAGE_PARAMETERS, parse_message_query

logger = logging.getLogger("outbox.console")

KEY_PARAMETER = "code"


def page() -> tuple[int, str, dict[str, str]]:
    """The console's page: (status, HTML, headers), with a fresh nonce for its inline script and
    style, and a policy that lets it run nothing else and load nothing from anywhere."""
    nonce = secrets.token_urlsafe(18)
    policy = (
        "default-src 'none'; "
        f"script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
    }
    return 200, render(nonce), headers


def actor(headers: Mapping[str, str], query: Query) -> str:
    """The identity of the key a request came with: a short hash, never the key."""
    lowered = {k.lower(): v for k, v in headers.items()}
    given = lowered.get("x-functions-key") or dict(query).get(KEY_PARAMETER) or ""
    if not given:
        return "key:none"
    digest = hashlib.sha256(given.encode("utf-8", "surrogatepass")).hexdigest()
    return f"key:{digest[:12]}"


@http_endpoint("overview")
async def on_overview(query: Query) -> HttpResult:
    """``GET /api/outbox/overview``: the console's overview."""
    query_parameters(query, allowed=frozenset({KEY_PARAMETER}))
    relay = await functions_host.relay()
    threshold = relay.settings.alert_oldest_pending_seconds
    return 200, await views.overview(
        relay.pool,
        threshold,
        relay.settings.endpoint_names,
        notify_wakeups=relay.settings.wakes_by_postgres,
    )


@http_endpoint("messages")
async def on_messages(query: Query) -> HttpResult:
    """``GET /api/outbox/messages?status=…&event_type=…&…&after=…``: one page of messages."""
    params = query_parameters(query, allowed=frozenset({KEY_PARAMETER, *MESSAGE_PARAMETERS}))
    params.pop(KEY_PARAMETER, None)
    wanted = parse_message_query(params)
    relay = await functions_host.relay()
    return 200, await views.list_messages(relay.pool, wanted, relay.settings.endpoint_names)


@http_endpoint("message")
async def on_message(query: Query, message_id: str) -> HttpResult:
    """``GET /api/outbox/messages/{message_id}``: one message's detail."""
    query_parameters(query, allowed=frozenset({KEY_PARAMETER}))
    try:
        identifier = UUID(message_id)
    except ValueError:
        raise BadRequestError("message_id must be a message id (a UUID)") from None
    relay = await functions_host.relay()
    shown = await views.message(relay.pool, identifier)
    if shown is None:
        return 404, {"error": f"no message {identifier}"}
    return 200, shown


@http_endpoint("actions")
async def on_actions(query: Query) -> HttpResult:
    """``GET /api/outbox/actions``: the latest actions taken, newest first."""
    query_parameters(query, allowed=frozenset({KEY_PARAMETER}))
    relay = await functions_host.relay()
    return 200, {"actions": await views.actions(relay.pool)}


@http_endpoint("pause")
async def on_pause(body: bytes, who: str) -> HttpResult:
    """``POST /api/outbox/pause`` ``{"event_type": …, "endpoint": …, "action_id": …}``."""
    data = requests.action_body(_json_object(body))
    relay = await functions_host.relay()
    endpoints = relay.settings.endpoint_names
    key = requests.key_of(endpoints, data.get("event_type"), data.get("endpoint"))
    result = await actions.pause(relay.pool, key, actor=who, action_id=data.get("action_id"))
    if result.get("in_progress"):
        return _running(result)
    log_event(logger, logging.INFO, "outbox.pause", event_type=key[0], endpoint=key[1], by=who)
    return 200, result


@http_endpoint("resume")
async def on_resume(body: bytes, who: str) -> HttpResult:
    """``POST /api/outbox/resume`` (as pause): what waited for the endpoint is drained now."""
    data = requests.action_body(_json_object(body))
    relay = await functions_host.relay()
    endpoints = relay.settings.endpoint_names
    key = requests.key_of(endpoints, data.get("event_type"), data.get("endpoint"))
    result = await actions.resume(relay.pool, key, actor=who, action_id=data.get("action_id"))
    if result.get("in_progress"):
        return _running(result)
    log_event(logger, logging.INFO, "outbox.resume", event_type=key[0], endpoint=key[1], by=who)
    if result.get("due"):
        await relay.wake_now()
    return 200, result


@http_endpoint("resend")
async def on_resend(body: bytes, who: str) -> HttpResult:
    """``POST /api/outbox/resend`` ``{"message_ids": [...], "endpoint": …, "action_id": …}``:
    Processed messages sent again (same webhook-id), to one endpoint or to all."""
    data = requests.action_body(_json_object(body), requests.RESEND_FIELDS)
    ids, endpoint = requests.resend_body(data)
    relay = await functions_host.relay()
    result = await actions.resend(
        relay.pool,
        ids,
        endpoint,
        relay.settings.endpoint_names,
        actor=who,
        action_id=data.get("action_id"),
    )
    if result.get("in_progress"):
        return _running(result)
    log_event(logger, logging.INFO, "outbox.resend", resent=len(result["resent"]), by=who)
    if result["resent"] and not result["repeated"]:
        await relay.wake_now()
    return 200, result


def _running(result: dict[str, Any]) -> HttpResult:
    """409: another call runs this action id now; the same call, sent again once that one has
    finished, answers with its result."""
    action_id = result["action_id"]
    message = (
        f"action_id {action_id!r} is running in another call: send the same request again "
        "to get its result once it has finished"
    )
    return 409, {"error": message, "action_id": action_id, "in_progress": True}
