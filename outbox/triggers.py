"""What each Azure Functions trigger does, as plain async functions over plain values.

``function_app.py`` only unpacks the binding objects and calls these; ``outbox serve`` runs the same
functions without the Functions host. Every path ends in the one shared processor.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from outbox.errors import OutboxError
from outbox.models import DrainSummary
from outbox.runtime import shared_relay

logger = logging.getLogger("outbox.triggers")

# HTTP requests on Azure are cut off after 230 s; a drain also needs up to one lease to finish.
HTTP_DEFAULT_BUDGET_SECONDS = 30.0
HTTP_MAX_BUDGET_SECONDS = 120.0
HTTP_PARAMETERS = frozenset({"budgetSeconds", "code"})  # `code` carries the function key
MAX_LOGGED_HINT_CHARS = 200


class DrainFailedError(OutboxError):
    """A scheduled drain hit a database error (raised so the invocation shows as failed)."""


class BadDrainRequestError(OutboxError, ValueError):
    """The drain endpoint was called with parameters it does not accept."""


async def drain(trigger: str, budget_seconds: float | None = None) -> DrainSummary:
    """Run the shared processor once and log its summary."""
    relay = await shared_relay()
    summary = await relay.processor.execute(budget_seconds)
    level = logging.ERROR if summary.error else logging.INFO
    logger.log(level, "outbox drain (%s): %s", trigger, json.dumps(summary.as_dict()))
    return summary


async def on_hint(
    body: bytes, *, message_id: str | None, dequeue_count: int | None
) -> DrainSummary:
    """Queue trigger: the message only says "rows may be waiting"; its content is never trusted.

    Whatever the message holds (JSON, garbage, nothing), the invocation drains and succeeds, so
    hints never pile up in the poison queue. Database errors are logged; the timer sweeps later.
    """
    logger.info(
        "outbox wake-up hint %s (dequeue %s): %s",
        message_id,
        dequeue_count,
        describe_hint(body),
    )
    return await drain("queue")


async def on_timer(*, past_due: bool) -> DrainSummary:
    """Timer trigger: the sweep that catches rows whose hint was lost."""
    if past_due:
        logger.warning("outbox timer is running late (past due)")
    summary = await drain("timer")
    if summary.error:
        raise DrainFailedError(f"scheduled outbox drain failed: {summary.error}")
    return summary


async def on_drain_request(params: Mapping[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
    """HTTP trigger: ``POST /api/outbox/drain[?budgetSeconds=N]`` → (status, JSON body)."""
    try:
        budget = parse_budget(params, body)
    except BadDrainRequestError as exc:
        return 400, {"error": str(exc)}
    try:
        summary = await drain("http", budget)
    except OutboxError:
        logger.exception("outbox drain endpoint failed")
        return 500, {"error": "the relay is misconfigured; see the function logs"}
    result = summary.as_dict()
    if summary.error:
        result["error"] = "database error; see the function logs"
        return 503, result
    return 200, result


def parse_budget(params: Mapping[str, str], body: bytes) -> float:
    """The drain budget from ``?budgetSeconds=`` or a JSON body ``{"budgetSeconds": N}``."""
    unknown = sorted(set(params) - HTTP_PARAMETERS)
    if unknown:
        raise BadDrainRequestError(f"unknown parameter(s): {', '.join(unknown)}")
    value: Any = params.get("budgetSeconds")
    if body.strip():
        value = _budget_from_body(body, value)
    if value is None:
        return HTTP_DEFAULT_BUDGET_SECONDS
    try:
        budget = float(value)
    except (TypeError, ValueError):
        raise BadDrainRequestError("budgetSeconds must be a number of seconds") from None
    if not math.isfinite(budget) or not 0 < budget <= HTTP_MAX_BUDGET_SECONDS:
        raise BadDrainRequestError(
            f"budgetSeconds must be greater than 0 and at most {HTTP_MAX_BUDGET_SECONDS:g}"
        )
    return budget


def _budget_from_body(body: bytes, from_query: Any) -> Any:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadDrainRequestError("the request body must be empty or a JSON object") from None
    if not isinstance(data, dict):
        raise BadDrainRequestError("the request body must be empty or a JSON object")
    unknown = sorted(set(data) - {"budgetSeconds"})
    if unknown:
        raise BadDrainRequestError(f"unknown field(s) in the body: {', '.join(unknown)}")
    if "budgetSeconds" in data and from_query is not None:
        raise BadDrainRequestError("give budgetSeconds in the query or in the body, not both")
    if isinstance(data.get("budgetSeconds"), bool):
        raise BadDrainRequestError("budgetSeconds must be a number of seconds")
    return data.get("budgetSeconds", from_query)


def describe_hint(body: bytes) -> str:
    """A bounded, printable account of a hint's content, for the log only."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        kind = "not JSON"
    else:
        kind = "JSON" if isinstance(parsed, dict) else f"JSON {type(parsed).__name__}"
    shown = text if len(text) <= MAX_LOGGED_HINT_CHARS else text[:MAX_LOGGED_HINT_CHARS] + "…"
    return f"{kind}, {len(body)} bytes: {shown!r}"
