"""The relay's Azure Functions as a Blueprint: add them to any Python v2 programming model app.

    import azure.functions as func
    from outbox.functions import bp

    app = func.FunctionApp()
    app.register_functions(bp)

Three triggers drive the one processor (queue hint, five-minute timer, HTTP drain); three more
serve operations (status, requeue, daily purge); the rest are the operator's console (its page,
its read functions and its actions; ``outbox.azure.console``). Each unpacks its binding and calls
``outbox.triggers``; nothing connects at import time (the host imports the app while indexing).
The HTTP functions are keyed (auth level ``FUNCTION``) whatever the app's default, except the
console's page, which holds no data. Every JSON answer says ``nosniff`` and ``no-store``; the
acting functions name their caller (``outbox.azure.caller``) and refuse a key in the address.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from outbox.azure import caller, console, triggers

bp = func.Blueprint()  # type: ignore[no-untyped-call]
# On every JSON answer: never sniffed as another type, never kept by a cache.
JSON_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def json_response(status: int, body: dict[str, Any]) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body), status_code=status, mimetype="application/json", headers=JSON_HEADERS
    )


def download(file: console.Download) -> func.HttpResponse:
    """A JSON document to save under its own name."""
    disposition = f'attachment; filename="{file.filename}"'
    headers = JSON_HEADERS | {"Content-Disposition": disposition}
    return func.HttpResponse(
        file.body, status_code=200, mimetype="application/json", headers=headers
    )


def caller_of(req: func.HttpRequest) -> caller.Caller:
    return caller.of(req.headers, query_pairs(req))


def query_pairs(req: func.HttpRequest) -> list[tuple[str, str]]:
    """The query string's parameters in order, a repeated one as often as it is given (the
    binding's ``params`` keep one of them)."""
    query = urlsplit(req.url).query
    if query:
        return parse_qsl(query, keep_blank_values=True)
    return list(req.params.items())


@bp.function_name(name="outbox_queue")
@bp.queue_trigger(
    arg_name="msg", queue_name="%OUTBOX_QUEUE_NAME%", connection="AzureWebJobsStorage"
)
async def outbox_queue(msg: func.QueueMessage) -> None:
    """A wake-up hint arrived: drain now."""
    await triggers.on_hint(msg.get_body(), message_id=msg.id, dequeue_count=msg.dequeue_count)


@bp.function_name(name="outbox_timer")
@bp.timer_trigger(
    arg_name="timer", schedule="0 */5 * * * *", run_on_startup=False, use_monitor=True
)
async def outbox_timer(timer: func.TimerRequest) -> None:
    """Every five minutes: drain whatever a lost hint left behind."""
    await triggers.on_timer(past_due=timer.past_due)


@bp.function_name(name="outbox_drain")
@bp.route(route="outbox/drain", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_drain(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/drain[?budget_seconds=N]: drain now, answer with the JSON summary."""
    status, body = await triggers.on_drain_request(query_pairs(req), req.get_body(), caller_of(req))
    return json_response(status, body)


@bp.function_name(name="outbox_status")
@bp.route(route="outbox/status", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_status(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/status: backlog health; 200 when healthy, 503 when not."""
    status, body = await triggers.on_status_request(query_pairs(req))
    return json_response(status, body)


@bp.function_name(name="outbox_requeue")
@bp.route(route="outbox/requeue", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_requeue(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/requeue: set Failed messages back to Pending (JSON body, dry_run)."""
    status, body = await triggers.on_requeue_request(req.get_body(), caller_of(req))
    return json_response(status, body)


# The operator's console: its page (no data in it, so no key), the read functions (a viewer's
# key may be given for these alone) and the acting ones (the function key).
@bp.function_name(name="outbox_console")
@bp.route(route="outbox/console", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
async def outbox_console(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/console: the operator's console page (it asks the API with a key)."""
    status, html, headers = console.page()
    return func.HttpResponse(html, status_code=status, mimetype="text/html", headers=headers)


@bp.function_name(name="outbox_overview")
@bp.route(route="outbox/overview", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_overview(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/overview: health, counts, rates, open and paused endpoints, failure
    reasons, and whether the caller may act."""
    return json_response(*await console.on_overview(query_pairs(req), caller_of(req)))


@bp.function_name(name="outbox_messages")
@bp.route(route="outbox/messages", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_messages(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/messages?status=…: one page of messages matching the filters."""
    return json_response(*await console.on_messages(query_pairs(req)))


@bp.function_name(name="outbox_message")
@bp.route(route="outbox/messages/{message_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_message(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/messages/{message_id}[?payload=full]: a message, its endpoints and
    attempts; or its whole payload, to save."""
    message_id = req.route_params.get("message_id", "")
    shown = await console.on_message(query_pairs(req), message_id)
    if isinstance(shown, console.Download):
        return download(shown)
    return json_response(*shown)


@bp.function_name(name="outbox_actions")
@bp.route(route="outbox/actions", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_actions(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/actions: the actions taken (what, filter, count, when, who, from where),
    a page at a time, filtered by actor, action and time."""
    return json_response(*await console.on_actions(query_pairs(req)))


@bp.function_name(name="outbox_endpoints")
@bp.route(route="outbox/endpoints", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_endpoints(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/outbox/endpoints: every endpoint, its state, breaker, pause and rates."""
    return json_response(*await console.on_endpoints(query_pairs(req)))


@bp.function_name(name="outbox_resend")
@bp.route(route="outbox/resend", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_resend(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/resend: Processed messages sent again, to one endpoint or to all."""
    return json_response(*await console.on_resend(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_cancel")
@bp.route(route="outbox/cancel", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_cancel(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/cancel: Pending messages made Failed, with who cancelled them and why."""
    return json_response(*await console.on_cancel(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_replay")
@bp.route(route="outbox/replay", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_replay(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/replay: a window's Processed messages sent again (dry run first)."""
    return json_response(*await console.on_replay(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_probe")
@bp.route(route="outbox/probe", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_probe(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/probe: an open breaker's probe now, and its waiting messages due."""
    return json_response(*await console.on_probe(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_pause")
@bp.route(route="outbox/pause", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_pause(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/pause: an endpoint's deliveries wait, for every relay."""
    return json_response(*await console.on_pause(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_resume")
@bp.route(route="outbox/resume", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
async def outbox_resume(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/outbox/resume: a paused endpoint's deliveries go again, at once."""
    return json_response(*await console.on_resume(req.get_body(), caller_of(req)))


@bp.function_name(name="outbox_purge")
@bp.timer_trigger(arg_name="timer", schedule="0 30 3 * * *", run_on_startup=False, use_monitor=True)
async def outbox_purge(timer: func.TimerRequest) -> None:
    """Daily at 03:30 UTC: delete rows past their retention, in short batches."""
    await triggers.on_purge_timer()


def app() -> func.FunctionApp:
    """A Functions app of the relay's functions alone (what ``outbox serve`` hosts by default)."""
    application = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
    application.register_functions(bp)
    return application
