"""One message as ``python -m outbox show`` gives it: every column, its attempt history, where
each endpoint stands; a payload Python cannot decode given as the database's text, saying why.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from uuid import UUID

from outbox.core.models import Status
from outbox.operations import sql
from outbox.store.connection import Connection

# How show says a payload is given as the database's text, before why.
UNREADABLE = "payload shown as the database's text, not decoded"


async def show(conn: Connection, message_id: UUID) -> dict[str, Any] | None:
    """A message with its attempt history, or None if there is no such message."""
    message = await sql.row(conn, "show_message", message_id)
    if message is None:
        return None
    message["payload"], message["payload_as_text"] = read_payload(message["payload"])
    message["attempts"] = await sql.rows(conn, "show_attempts", message_id)
    state = message.pop("endpoint_state")
    message["endpoints"] = endpoints_of(message, json.loads(state) if state else None)
    return finished(message)


def read_payload(stored: Any) -> tuple[Any, str | None]:
    """A payload as ``show`` gives it: the JSON value, not its text; or, when Python cannot
    decode it or write it out again, the database's text of it and why (``payload_as_text``).
    SQL stores what ``enqueue`` refuses and the relay still delivers: jsonb nested thousands
    deep, a number of thousands of digits."""
    if not isinstance(stored, str):
        return stored, None
    try:
        value = json.loads(stored)
        json.dumps(value)  # what show prints: nested deeper than it follows, it fails here
    except RecursionError:
        return stored, f"{UNREADABLE}: nested deeper than Python's JSON decoder follows"
    except ValueError:  # the database's jsonb text is JSON: what is left is a number's length
        return stored, (
            f"{UNREADABLE}: it holds a number of more than {sys.get_int_max_str_digits()} "
            "digits, Python's limit"
        )
    return value, None


def finished(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` as ``show`` gives it: a finished row (``Processed`` or ``Failed``) is not due
    and not being processed, whatever its columns kept from its last lease, and says when it
    finished (``processed_at``, or the end of its last attempt, for a ``Failed`` one);
    ``finished_at`` is None for a message still under way."""
    done = message["status"] in (Status.PROCESSED, Status.FAILED)
    message["finished_at"] = None
    if done:
        message["next_attempt_at"] = None
        message["processing_started_at"] = None
        last = message["attempts"][-1]["finished_at"] if message["attempts"] else None
        message["finished_at"] = message["processed_at"] or last
    return message


def endpoints_of(
    message: dict[str, Any], state: dict[str, dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Where each endpoint that has been tried stands: its status, attempts and last error.

    Its kept state where the endpoints differ; otherwise the row's status, and the count and
    last error of the endpoint's attempts in the history."""
    history: dict[str, list[dict[str, Any]]] = {}
    for attempt in message["attempts"]:
        if attempt["endpoint"] is not None:
            history.setdefault(attempt["endpoint"], []).append(attempt)
    names = list(dict.fromkeys([*(state or {}), *history]))
    shown = []
    for name in names:
        tried = history.get(name, [])
        kept = (state or {}).get(name)
        shown.append(
            {
                "endpoint": name,
                "status": kept["status"] if kept else message["status"],
                "attempts": kept["attempts"] if kept else len(tried),
                "last_error": kept.get("error")
                if kept
                else (tried[-1]["error"] if tried else None),
            }
        )
    return shown
