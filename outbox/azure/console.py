"""The operator's console as plain async functions over plain values: its page and its JSON API.

``outbox.functions`` binds each to a route: reading ``/api/outbox/console`` (the page),
``/api/outbox/overview``, ``/api/outbox/messages[/{message_id}]``, ``/api/outbox/endpoints``,
``/api/outbox/actions``; acting ``/api/outbox/pause``, ``/api/outbox/resume``,
``/api/outbox/resend``, ``/api/outbox/cancel``, ``/api/outbox/replay``, ``/api/outbox/probe``
(requeue and drain are ``outbox.triggers``'). Reading and acting are separate functions, so a key
can be given that reads but cannot act: on Azure a function-level key of the read functions,
under ``outbox serve`` ``OUTBOX_CONSOLE_VIEW_KEY(S)``. The page holds no data and needs no key:
it asks the API with the key the operator gives it, in a header. Every action is recorded with
who took it (``outbox.azure.caller``), and refused when the key came in the address.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from outbox.azure.caller import KEY_PARAMETER, Caller
from outbox.azure.console_page import render
from outbox.azure.host import functions_host
from outbox.azure.triggers import HttpResult, Query, _json_object, http_endpoint, query_parameters
from outbox.core.errors import BadRequestError, NotFoundError
from outbox.core.logs import log_event
from outbox.core.redact import shown_host
from outbox.core.settings import FUNCTION_KEY_NAME
from outbox.operations import actions, replay_window, requests, views
from outbox.operations.list_query import (
    ACTION_PARAMETERS,
    MESSAGE_PARAMETERS,
    parse_action_query,
    parse_message_query,
)

logger = logging.getLogger("outbox.console")
BODY_UNKNOWN = "unknown field(s) in the body: {}"


@dataclass(frozen=True, slots=True)
class Download:
    """An answer that is a file to save: its JSON text and the name to save it as."""

    body: str
    filename: str


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


@http_endpoint("overview")
async def on_overview(query: Query, who: Caller | None = None) -> HttpResult:
    """``GET /api/outbox/overview``: the console's overview, its health first, and who the caller
    is (``actor``, as the record of actions names them) and whether they may act."""
    query_parameters(query, allowed=frozenset({KEY_PARAMETER}))
    who = who or Caller(FUNCTION_KEY_NAME)
    relay = await functions_host.relay()
    threshold = relay.settings.alert_oldest_pending_seconds
    shown = await views.overview(
        relay.pool,
        threshold,
        relay.settings.endpoint_names,
        notify_wakeups=relay.settings.wakes_by_postgres,
    )
    return 200, shown | {"can_act": who.can_act, "actor": who.name}


@http_endpoint("messages")
async def on_messages(query: Query) -> HttpResult:
    """``GET /api/outbox/messages?status=…&event_type=…&…&after=…``: one page of messages."""
    params = query_parameters(query, allowed=frozenset({KEY_PARAMETER, *MESSAGE_PARAMETERS}))
    params.pop(KEY_PARAMETER, None)
    wanted = parse_message_query(params)
    relay = await functions_host.relay()
    return 200, await views.list_messages(relay.pool, wanted, relay.settings.endpoint_names)


@http_endpoint("message")
async def on_message(query: Query, message_id: str) -> HttpResult | Download:
    """``GET /api/outbox/messages/{message_id}[?payload=full]``: one message's detail, or with
    ``payload=full`` its whole payload, as a file to save."""
    params = query_parameters(query, allowed=frozenset({KEY_PARAMETER, "payload"}))
    whole = params.get("payload")
    if whole is not None and whole != "full":
        raise BadRequestError("payload must be full (the whole payload, as a file) or left out")
    try:
        identifier = UUID(message_id)
    except ValueError:
        raise BadRequestError("message_id must be a message id (a UUID)") from None
    relay = await functions_host.relay()
    if whole:
        text = await views.payload(relay.pool, identifier)
        if text is None:
            raise NotFoundError(f"no outbox message {identifier}")
        return Download(text, f"{identifier}.json")
    hold = relay.settings.ordering_on_failure == "hold"
    shown = await views.message(relay.pool, identifier, hold_on_failure=hold)
    if shown is None:
        raise NotFoundError(f"no outbox message {identifier}")
    return 200, shown


@http_endpoint("actions")
async def on_actions(query: Query) -> HttpResult:
    """``GET /api/outbox/actions?limit=…&before=…&actor=…&action=…&since=…&until=…``: one page
    of the actions taken, newest first, and the cursor of the next."""
    params = query_parameters(query, allowed=frozenset({KEY_PARAMETER, *ACTION_PARAMETERS}))
    params.pop(KEY_PARAMETER, None)
    wanted = parse_action_query(params)
    relay = await functions_host.relay()
    return 200, await views.actions(relay.pool, wanted)


@http_endpoint("endpoints")
async def on_endpoints(query: Query) -> HttpResult:
    """``GET /api/outbox/endpoints``: every configured endpoint, its state and its rates."""
    query_parameters(query, allowed=frozenset({KEY_PARAMETER}))
    relay = await functions_host.relay()
    settings = relay.settings
    hosts = {
        (event_type, endpoint.name): shown_host(endpoint.url)
        for event_type, group in settings.endpoints.items()
        for endpoint in group
        if endpoint.name is not None
    }
    shown = await views.endpoints_page(relay.pool, settings.endpoint_names, hosts)
    return 200, {"endpoints": shown}


async def _endpoint_action(
    name: str, act: Callable[..., Awaitable[dict[str, Any]]], body: bytes, who: Caller
) -> tuple[Any, dict[str, Any]]:
    """An action on one endpoint (pause, resume, probe) as its route's body names it: the relay
    and the action's result, logged unless another call runs the same ``action_id``."""
    actor = who.acting()
    data = requests.action_body(_json_object(body))
    relay = await functions_host.relay()
    endpoints = relay.settings.endpoint_names
    key = requests.key_of(endpoints, data.get("event_type"), data.get("endpoint"))
    result = await act(relay.pool, key, actor=actor, action_id=data.get("action_id"))
    if not result.get("in_progress"):
        log_event(
            logger, logging.INFO, f"outbox.{name}", event_type=key[0], endpoint=key[1], by=who.name
        )
    return relay, result


@http_endpoint("pause")
async def on_pause(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/pause`` ``{"event_type": …, "endpoint": …, "action_id": …}``."""
    _, result = await _endpoint_action("pause", actions.pause, body, who)
    if result.get("in_progress"):
        return _running(result)
    return 200, result


@http_endpoint("resume")
async def on_resume(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/resume`` (as pause): what waited for the endpoint is drained now."""
    relay, result = await _endpoint_action("resume", actions.resume, body, who)
    if result.get("in_progress"):
        return _running(result)
    if result.get("due"):
        await relay.wake_now()
    return 200, result


@http_endpoint("probe")
async def on_probe(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/probe`` ``{"event_type": …, "endpoint": …, "action_id": …}``: the
    endpoint's breaker due for its probe now, its waiting messages due now, and a drain woken;
    409 when its breaker is not open."""
    relay, result = await _endpoint_action("probe", actions.probe, body, who)
    if result.get("in_progress"):
        return _running(result)
    if not result["repeated"]:
        await relay.wake_now()
    return 200, result


@http_endpoint("resend")
async def on_resend(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/resend`` ``{"message_ids": [...], "endpoint": …, "action_id": …,
    "dry_run": …}``: Processed messages sent again (same webhook-id), to one endpoint or to
    all."""
    actor = who.acting()
    data = requests.action_body(_json_object(body), requests.RESEND_FIELDS)
    ids, endpoint = requests.resend_body(data)
    relay = await functions_host.relay()
    result = await actions.resend(
        relay.pool,
        ids,
        endpoint,
        relay.settings.endpoint_names,
        actor=actor,
        action_id=data.get("action_id"),
        dry_run=data.get("dry_run", False),
    )
    if result.get("in_progress"):
        return _running(result)
    if result.get("dry_run"):
        return 200, result
    log_event(logger, logging.INFO, "outbox.resend", resent=len(result["resent"]), by=who.name)
    if result["resent"] and not result["repeated"]:
        await relay.wake_now()
    return 200, result


@http_endpoint("cancel")
async def on_cancel(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/cancel`` ``{"message_ids": [...], "reason": …, "action_id": …,
    "dry_run": …}``: Pending messages made Failed, with who cancelled them and why."""
    actor = who.acting()
    data = requests.action_body(_json_object(body), requests.CANCEL_FIELDS)
    ids, reason = requests.cancel_body(data)
    relay = await functions_host.relay()
    result = await actions.cancel(
        relay.pool,
        ids,
        reason,
        actor=actor,
        action_id=data.get("action_id"),
        dry_run=data.get("dry_run", False),
        hold_on_failure=relay.settings.ordering_on_failure == "hold",
    )
    if result.get("in_progress"):
        return _running(result)
    if result.get("dry_run"):
        return 200, result
    log_event(
        logger, logging.INFO, "outbox.cancel", cancelled=len(result["cancelled"]), by=who.name
    )
    if result.get("released") and not result["repeated"]:
        await relay.wake_now()
    return 200, result


@http_endpoint("replay")
async def on_replay(body: bytes, who: Caller) -> HttpResult:
    """``POST /api/outbox/replay`` ``{"event_type": …, "endpoint": …, "created_from": …,
    "created_to": …, "dry_run": …, "action_id": …}``: the window's Processed messages sent
    again, in batches, resumable under its ``action_id``."""
    actor = who.acting()
    wanted = requests.parse(requests.ReplayRequest, _json_object(body), unknown=BODY_UNKNOWN)
    relay = await functions_host.relay()
    endpoints = relay.settings.endpoint_names
    result = await replay_window.replay(relay.pool, wanted, endpoints, actor=actor)
    if result.get("in_progress"):
        return _running(result)
    if result.get("dry_run"):
        return 200, result
    log_event(logger, logging.INFO, "outbox.replay", resent=result["resent"], by=who.name)
    if result["resent"] and not result["repeated"]:
        await relay.wake_now()
    return 200, result


def _running(result: Mapping[str, Any]) -> HttpResult:
    """409: another call runs this action id now; the same call, sent again once that one has
    finished, answers with its result."""
    action_id = result["action_id"]
    message = (
        f"action_id {action_id!r} is running in another call: send the same request again "
        "to get its result once it has finished"
    )
    return 409, {"error": message, "action_id": action_id, "in_progress": True}
