"""What each Azure Functions trigger does, as plain async functions over plain values.

``function_app.py`` only unpacks the binding objects and calls these; ``outbox serve`` runs the same
functions without the Functions host. Every path ends in the one shared processor.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, ParamSpec

from outbox import operations
from outbox.errors import BadRequestError, DatabaseError, DrainFailedError, OutboxError
from outbox.logs import log_event
from outbox.models import DrainSummary
from outbox.runtime import shared_relay
from outbox.wakeup import notify_once

logger = logging.getLogger("outbox.triggers")
P = ParamSpec("P")

# HTTP requests on Azure are cut off after 230 s; a drain also needs up to one HTTP timeout to
# finish the requests in flight when its budget ends.
HTTP_DEFAULT_BUDGET_SECONDS = 30.0
HTTP_MAX_BUDGET_SECONDS = 120.0
HTTP_PARAMETERS = frozenset({"budget_seconds", "code"})  # `code` carries the function key
MAX_LOGGED_HINT_CHARS = 200
MISCONFIGURED = "the relay is misconfigured; see the function logs"
DATABASE_DOWN = "database error; see the function logs"


async def drain(
    trigger: str, budget_seconds: float | None = None, *, until_caught_up: bool = False
) -> DrainSummary:
    """Run the shared processor once and log its summary."""
    relay = await shared_relay()
    summary = await relay.processor.execute(budget_seconds, until_caught_up=until_caught_up)
    level = logging.ERROR if summary.error else logging.INFO
    log_event(logger, level, "outbox.drain", trigger=trigger, **summary.as_dict())
    if (
        summary.released
        and summary.stopped_by in ("budget", "stopped")
        and relay.settings.has_queue
    ):
        # Messages given back as the run ended are due now: a hint has the next drain take them
        # (here or on another instance) instead of the next timer sweep.
        await notify_once(relay.settings)
    return summary


async def on_hint(
    body: bytes, *, message_id: str | None, dequeue_count: int | None
) -> DrainSummary:
    """Queue trigger: the message only says "rows may be waiting"; its content is never trusted.

    Whatever the decoded message holds (JSON, garbage, nothing), the invocation drains and
    succeeds. (A message that is not base64 never gets here: the host cannot decode it, and
    retries it into the poison queue.) Database errors are logged; the timer sweeps later.
    The drain ends once it has caught up, so the next hint is taken soon even under steady load.
    """
    logger.info(
        "outbox wake-up hint %s (dequeue %s): %s",
        message_id,
        dequeue_count,
        describe_hint(body),
    )
    return await drain("queue", until_caught_up=True)


async def on_timer(*, past_due: bool) -> DrainSummary:
    """Timer trigger: the sweep that catches rows whose hint was lost."""
    if past_due:
        logger.warning("outbox timer is running late (past due)")
    summary = await drain("timer")
    if summary.error:
        raise DrainFailedError(f"scheduled outbox drain failed: {summary.error}")
    return summary


HttpResult = tuple[int, dict[str, Any]]


def http_endpoint(
    name: str,
) -> Callable[[Callable[P, Awaitable[HttpResult]]], Callable[P, Awaitable[HttpResult]]]:
    """Turn an endpoint's errors into JSON answers that leak nothing.

    Bad parameters → 400 with the reason; bad settings → 500; database trouble → 503. The details
    go to the function log, never into the answer.
    """

    def decorate(handler: Callable[P, Awaitable[HttpResult]]) -> Callable[P, Awaitable[HttpResult]]:
        @functools.wraps(handler)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> HttpResult:
            try:
                return await handler(*args, **kwargs)
            except BadRequestError as exc:
                return 400, {"error": str(exc)}
            except OutboxError:
                logger.exception("outbox %s endpoint failed", name)
                return 500, {"error": MISCONFIGURED}
            except DatabaseError as exc:
                logger.error("outbox %s endpoint: database error: %s", name, exc.kind)
                return 503, {"error": DATABASE_DOWN}

        return guarded

    return decorate


@http_endpoint("drain")
async def on_drain_request(params: Mapping[str, str], body: bytes) -> HttpResult:
    """HTTP trigger: ``POST /api/outbox/drain[?budget_seconds=N]`` → (status, JSON body)."""
    summary = await drain("http", parse_budget(params, body))
    result = summary.as_dict()
    if summary.error:
        result["error"] = DATABASE_DOWN
        return 503, result
    return 200, result


@http_endpoint("status")
async def on_status_request() -> HttpResult:
    """HTTP trigger: ``GET /api/outbox/status`` → 200 when healthy, 503 when not (same JSON)."""
    relay = await shared_relay()
    status = await operations.backlog_status(
        relay.pool, relay.settings.alert_oldest_pending_seconds
    )
    return (200 if status.healthy else 503), status.as_dict()


@http_endpoint("requeue")
async def on_requeue_request(body: bytes) -> HttpResult:
    """HTTP trigger: ``POST /api/outbox/requeue`` with a JSON body naming the Failed rows."""
    wanted, dry_run = parse_requeue(body)
    wanted.check()
    relay = await shared_relay()
    report = await operations.requeue(relay.pool, wanted, dry_run=dry_run)
    log_event(logger, logging.INFO, "outbox.requeue", requeued=report.requeued, dry_run=dry_run)
    return 200, report.as_dict()


async def on_purge_timer() -> operations.PurgeReport:
    """Daily timer: delete rows past retention, in short batches."""
    relay = await shared_relay()
    settings = relay.settings
    report = await operations.purge(
        relay.pool,
        retention_days=settings.retention_days,
        failed_retention_days=settings.failed_retention_days,
        batch_size=settings.purge_batch_size,
    )
    log_event(logger, logging.INFO, "outbox.purge", **report.as_dict())
    return report


REQUEUE_FIELDS = frozenset(
    {"message_ids", "event_type", "created_from", "created_to", "all_failed", "dry_run"}
)


def parse_requeue(body: bytes) -> tuple[operations.RequeueFilter, bool]:
    """The requeue request body: ``{"message_ids": [...], "event_type": …, "created_from": …,
    "created_to": …, "all_failed": bool, "dry_run": bool}``."""
    data = _json_object(body)
    unknown = sorted(set(data) - REQUEUE_FIELDS)
    if unknown:
        raise BadRequestError(f"unknown field(s) in the body: {', '.join(unknown)}")
    try:
        ids = data.get("message_ids")
        wanted = operations.RequeueFilter(
            message_ids=None if ids is None else _uuids(ids),
            event_type=_optional_str(data.get("event_type"), "event_type"),
            created_from=_optional_time(data.get("created_from"), "created_from"),
            created_to=_optional_time(data.get("created_to"), "created_to"),
            all_failed=_bool(data.get("all_failed", False), "all_failed"),
        )
        dry_run = _bool(data.get("dry_run", False), "dry_run")
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    return wanted, dry_run


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[[[[…" nesting
        raise BadRequestError("the request body must be empty or a JSON object") from None
    if not isinstance(data, dict):
        raise BadRequestError("the request body must be empty or a JSON object")
    return data


def _uuids(value: Any) -> tuple[uuid.UUID, ...]:
    problem = "message_ids must be a non-empty list of message ids (UUIDs)"
    if not isinstance(value, list) or not value:
        raise ValueError(problem)
    try:
        return tuple(uuid.UUID(str(item)) for item in value)
    except ValueError:
        raise ValueError(problem) from None


def _optional_str(value: Any, name: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _optional_time(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{name} must be an ISO 8601 time")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{name} must be an ISO 8601 time") from None


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def parse_budget(params: Mapping[str, str], body: bytes) -> float:
    """The drain budget from ``?budget_seconds=`` or a JSON body ``{"budget_seconds": N}``."""
    unknown = sorted(set(params) - HTTP_PARAMETERS)
    if unknown:
        raise BadRequestError(f"unknown parameter(s): {', '.join(unknown)}")
    value: Any = params.get("budget_seconds")
    if body.strip():
        value = _budget_from_body(body, value)
    if value is None:
        return HTTP_DEFAULT_BUDGET_SECONDS
    try:
        budget = float(value)
    except (TypeError, ValueError):
        raise BadRequestError("budget_seconds must be a number of seconds") from None
    except OverflowError:  # a JSON integer too large for a float: out of range, like 1e400
        budget = math.inf
    if not math.isfinite(budget) or not 0 < budget <= HTTP_MAX_BUDGET_SECONDS:
        raise BadRequestError(
            f"budget_seconds must be greater than 0 and at most {HTTP_MAX_BUDGET_SECONDS:g}"
        )
    return budget


def _budget_from_body(body: bytes, from_query: Any) -> Any:
    data = _json_object(body)
    unknown = sorted(set(data) - {"budget_seconds"})
    if unknown:
        raise BadRequestError(f"unknown field(s) in the body: {', '.join(unknown)}")
    if "budget_seconds" in data and from_query is not None:
        raise BadRequestError("give budget_seconds in the query or in the body, not both")
    if isinstance(data.get("budget_seconds"), bool):
        raise BadRequestError("budget_seconds must be a number of seconds")
    return data.get("budget_seconds", from_query)


def describe_hint(body: bytes) -> str:
    """A bounded, printable account of a hint's content, for the log only."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: "[[[[…" nested too deep to parse
        kind = "not JSON"
    else:
        kind = "JSON" if isinstance(parsed, dict) else f"JSON {type(parsed).__name__}"
    shown = text if len(text) <= MAX_LOGGED_HINT_CHARS else text[:MAX_LOGGED_HINT_CHARS] + "…"
    return f"{kind}, {len(body)} bytes: {shown!r}"
