"""What each Azure Functions trigger does, as plain async functions over plain values.

``function_app.py`` only unpacks the binding objects and calls these; ``outbox serve`` runs the same
functions without the Functions host. Every path ends in the one shared processor.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from outbox.azure import caller
from outbox.azure.caller import Caller
from outbox.azure.host import functions_host
from outbox.core.errors import (
    BadRequestError,
    ConflictError,
    DatabaseError,
    DrainFailedError,
    NotFoundError,
    OutboxError,
)
from outbox.core.logs import log_event
from outbox.core.models import DrainSummary
from outbox.core.settings import FUNCTION_KEY_NAME
from outbox.operations import actions, requests, retention, status

logger = logging.getLogger("outbox.triggers")
P = ParamSpec("P")
R = TypeVar("R")

HTTP_DEFAULT_BUDGET_SECONDS = 30.0
HTTP_PARAMETERS = frozenset({"code"})  # `code` carries the function key, on every route
MAX_LOGGED_HINT_CHARS = 200
MISCONFIGURED = "the relay is misconfigured; see the function logs"
DATABASE_DOWN = "database error; see the function logs"


async def drain(
    trigger: str, budget_seconds: float | None = None, *, until_caught_up: bool = False
) -> DrainSummary:
    """Run the shared processor once and log its summary."""
    relay = await functions_host.relay()
    summary = await relay.drain(budget_seconds, until_caught_up=until_caught_up, trigger=trigger)
    level = logging.ERROR if summary.error else logging.INFO
    log_event(logger, level, "outbox.drain", trigger=trigger, **summary.as_dict())
    return summary


async def on_startup() -> DrainSummary:
    """A host starting up (``outbox serve``): drain once, for what waited while none ran."""
    return await drain("startup")


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
    await record_backlog()
    return summary


async def record_backlog() -> None:
    """The sweep's backlog figures, for the telemetry's gauges; a failure is only a warning."""
    relay = await functions_host.relay()
    try:
        await status.backlog_status(relay.pool, relay.settings.alert_oldest_pending_seconds)
    except DatabaseError as exc:
        logger.warning("outbox backlog figures not read: database error: %s", exc.kind)


HttpResult = tuple[int, dict[str, Any]]


def _pairs(query: Query | Mapping[str, str]) -> Query:
    return list(query.items()) if isinstance(query, Mapping) else query


def http_endpoint(
    name: str,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | HttpResult]]]:
    """Turn an endpoint's errors into JSON answers that leak nothing.

    Bad parameters → 400 with the reason; an id or an endpoint that does not exist → 404, an
    action the state does not allow → 409, each saying so; bad settings → 500; database
    trouble → 503. The details go to the function log, never into the answer.
    """

    def decorate(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | HttpResult]]:
        @functools.wraps(handler)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R | HttpResult:
            try:
                return await handler(*args, **kwargs)
            except BadRequestError as exc:
                return 400, {"error": str(exc)}
            except NotFoundError as exc:
                return 404, {"error": str(exc)}
            except ConflictError as exc:
                return 409, {"error": str(exc)}
            except DatabaseError as exc:  # before OutboxError, its base: an outage, not a bug
                logger.error("outbox %s endpoint: database error: %s", name, exc.kind)
                return 503, {"error": DATABASE_DOWN}
            except OutboxError:
                logger.exception("outbox %s endpoint failed", name)
                return 500, {"error": MISCONFIGURED}

        return guarded

    return decorate


@http_endpoint("drain")
async def on_drain_request(
    query: Query | Mapping[str, str], body: bytes, who: Caller | None = None
) -> HttpResult:
    """HTTP trigger: ``POST /api/outbox/drain[?budget_seconds=N]`` → (status, JSON body).

    ``query``: the query string's (name, value) pairs, in order (or a mapping of them). The
    drain is recorded as an action of ``who`` (its caller), when the database takes the record.
    """
    pairs = _pairs(query)
    actor = (who or caller.of({}, pairs)).acting()
    budget = parse_budget(pairs, body)
    recorded = await _record(actions.begin, "drain", {"budget_seconds": budget}, actor)
    summary = await drain("http", budget)
    result = summary.as_dict()
    if summary.error:
        result["error"] = DATABASE_DOWN  # the details are in the log, not in answers or records
    if recorded is not None:
        await _record(actions.finish, recorded, summary.processed, result)
    return (503 if summary.error else 200), result


@http_endpoint("status")
async def on_status_request(query: Query | Mapping[str, str] = ()) -> HttpResult:
    """HTTP trigger: ``GET /api/outbox/status`` → 200 when healthy, 503 when not (same JSON)."""
    query_parameters(_pairs(query), allowed=HTTP_PARAMETERS)
    relay = await functions_host.relay()
    backlog = await status.backlog_status(
        relay.pool,
        relay.settings.alert_oldest_pending_seconds,
        notify_wakeups=relay.settings.wakes_by_postgres,
    )
    return (200 if backlog.healthy else 503), backlog.as_dict()


async def _record(write: Callable[..., Awaitable[R]], *args: Any) -> R | None:
    """A drain's record, written when the database takes it: a drain goes on without."""
    relay = await functions_host.relay()
    try:
        return await write(relay.pool, *args)
    except DatabaseError as exc:
        logger.warning("outbox drain not recorded: database error: %s", exc.kind)
        return None


@http_endpoint("requeue")
async def on_requeue_request(body: bytes, who: Caller | None = None) -> HttpResult:
    """HTTP trigger: ``POST /api/outbox/requeue`` with a JSON body naming the Failed rows.

    A requeue that is not a dry run is recorded as an action of ``who`` (its caller), once per
    ``action_id``: the same id sent again answers with the first one's result. With
    ``batch_size`` (and an ``action_id``), each call requeues one batch, going on from the last
    one of that action, and answers with the running count and whether it is ``done``."""
    actor = (who or Caller(FUNCTION_KEY_NAME)).acting()
    wanted = parse_requeue(body)
    relay = await functions_host.relay()
    if wanted.batch_size is not None and not wanted.dry_run and wanted.action_id is not None:
        report = await actions.requeue_batch(
            relay.pool,
            wanted.filter,
            batch_size=wanted.batch_size,
            actor=actor,
            action_id=wanted.action_id,
        )
        now = report.get("batch_requeued", 0)
    else:
        report = await actions.requeue(
            relay.pool,
            wanted.filter,
            dry_run=wanted.dry_run,
            actor=actor,
            action_id=wanted.action_id,
        )
        now = 0 if wanted.dry_run or report.get("repeated") else report["requeued"]
    log_event(
        logger,
        logging.INFO,
        "outbox.requeue",
        requeued=now,
        dry_run=wanted.dry_run,
        done=report.get("done", True),
    )
    if now:
        await relay.wake_now()  # due now: a drain takes them at once, not at the next sweep
    return 200, report


async def on_purge_timer() -> retention.PurgeReport:
    """Daily timer: delete rows past retention, in short batches."""
    relay = await functions_host.relay()
    settings = relay.settings
    report = await retention.purge(
        relay.pool,
        retention_days=settings.retention_days,
        failed_retention_days=settings.failed_retention_days,
        batch_size=settings.purge_batch_size,
    )
    log_event(logger, logging.INFO, "outbox.purge", **report.as_dict())
    return report


BODY_UNKNOWN = "unknown field(s) in the body: {}"
Query = Sequence[tuple[str, str]]


def parse_requeue(body: bytes) -> requests.RequeueRequest:
    """The requeue request body: ``{"message_ids": [...], "event_type": …, "endpoint": …,
    "error": …, "created_from": …, "created_to": …, "all_failed": bool, "dry_run": bool,
    "action_id": …, "batch_size": N}``."""
    return requests.parse(requests.RequeueRequest, _json_object(body), unknown=BODY_UNKNOWN)


def parse_budget(query: Query, body: bytes) -> float:
    """The drain budget from ``?budget_seconds=`` or a JSON body ``{"budget_seconds": N}``."""
    params = query_parameters(query, allowed=HTTP_PARAMETERS | {"budget_seconds"})
    data = _json_object(body)
    if "budget_seconds" in data and "budget_seconds" in params:
        raise BadRequestError("give budget_seconds in the query or in the body, not both")
    if not data:
        data = {name: value for name, value in params.items() if name != "code"}
    wanted = requests.parse(requests.DrainRequest, data, unknown=BODY_UNKNOWN)
    return wanted.budget_seconds or HTTP_DEFAULT_BUDGET_SECONDS


def query_parameters(query: Query, *, allowed: frozenset[str]) -> dict[str, str]:
    """The query's parameters by name: each at most once, and only ``allowed`` ones."""
    names = [name for name, _ in query]
    unknown = sorted(set(names) - allowed)
    if unknown:
        raise BadRequestError(f"unknown parameter(s): {', '.join(unknown)}")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise BadRequestError(f"parameter(s) given more than once: {', '.join(repeated)}")
    return dict(query)


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
