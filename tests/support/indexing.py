"""Index ``function_app.py`` as the Python worker does and check every binding.

Used by the test suite, and on its own (``python -m tests.support.indexing``) by CI under other
Python versions, where only the runtime requirements are installed.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any

EXPECTED: dict[str, list[dict[str, Any]]] = {
    "outbox_queue": [
        {
            "direction": "IN",
            "type": "queueTrigger",
            "name": "msg",
            "queueName": "%OUTBOX_QUEUE_NAME%",
            "connection": "AzureWebJobsStorage",
        }
    ],
    "outbox_timer": [
        {
            "direction": "IN",
            "type": "timerTrigger",
            "name": "timer",
            "schedule": "0 */5 * * * *",
            "runOnStartup": False,
            "useMonitor": True,
        }
    ],
    "outbox_drain": [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": ["POST"],
            "authLevel": "FUNCTION",
            "route": "outbox/drain",
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ],
    "outbox_status": [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": ["GET"],
            "authLevel": "FUNCTION",
            "route": "outbox/status",
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ],
    "outbox_requeue": [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": ["POST"],
            "authLevel": "FUNCTION",
            "route": "outbox/requeue",
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ],
    "outbox_purge": [
        {
            "direction": "IN",
            "type": "timerTrigger",
            "name": "timer",
            "schedule": "0 30 3 * * *",
            "runOnStartup": False,
            "useMonitor": True,
        }
    ],
}


def _http(route: str, method: str, auth: str = "FUNCTION") -> list[dict[str, Any]]:
    return [
        {
            "direction": "IN",
            "type": "httpTrigger",
            "name": "req",
            "methods": [method],
            "authLevel": auth,
            "route": route,
        },
        {"direction": "OUT", "type": "http", "name": "$return"},
    ]


# The operator's console: its page (no data, no key), its read and its acting functions.
EXPECTED |= {
    "outbox_console": _http("outbox/console", "GET", "ANONYMOUS"),
    "outbox_overview": _http("outbox/overview", "GET"),
    "outbox_messages": _http("outbox/messages", "GET"),
    "outbox_message": _http("outbox/messages/{message_id}", "GET"),
    "outbox_actions": _http("outbox/actions", "GET"),
    "outbox_endpoints": _http("outbox/endpoints", "GET"),
    "outbox_resend": _http("outbox/resend", "POST"),
    "outbox_pause": _http("outbox/pause", "POST"),
    "outbox_resume": _http("outbox/resume", "POST"),
    "outbox_cancel": _http("outbox/cancel", "POST"),
    "outbox_replay": _http("outbox/replay", "POST"),
    "outbox_probe": _http("outbox/probe", "POST"),
}


def index() -> dict[str, Any]:
    """``{function name: function}`` from one ``app.get_functions()`` call, as the worker makes."""
    import function_app

    return {f.get_function_name(): f for f in function_app.app.get_functions()}


def bindings(function: Any) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in function.get_raw_bindings()]


def check(functions: dict[str, Any]) -> None:
    """Raise AssertionError unless exactly the expected functions and bindings are indexed."""
    assert sorted(functions) == sorted(EXPECTED), sorted(functions)
    for name, function in functions.items():
        assert bindings(function) == EXPECTED[name], (name, bindings(function))
        assert inspect.iscoroutinefunction(function.get_user_function()), name


if __name__ == "__main__":
    found = index()
    check(found)
    print(f"indexed {len(found)} functions on Python {sys.version.split()[0]}: {', '.join(found)}")
