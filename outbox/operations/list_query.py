"""What the console's lists are asked for, validated in one place: the message list and the
``list`` command (a query string, or the command's flags), and the record of actions (its
query string).

A query string's values are all text; each is checked here and a bad one is a
``BadRequestError`` that names the parameter (in the front end's words: ``status`` for the
HTTP API, ``--status`` for the command).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from outbox.core.errors import BadRequestError
from outbox.core.models import Status

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_TEXT_CHARS = 200

# The HTTP parameters, and the command's flags for the same.
MESSAGE_PARAMETERS = (
    "status",
    "event_type",
    "endpoint",
    "ordering_key",
    "created_from",
    "created_to",
    "error",
    "after",
    "limit",
)
MESSAGE_FLAGS: Mapping[str, str] = {
    name: "--" + name.replace("_", "-") for name in MESSAGE_PARAMETERS
}
PARAMETER_NAMES: Mapping[str, str] = {name: name for name in MESSAGE_PARAMETERS}

# The record of actions: its page size, parameters and the actions it may be filtered by.
DEFAULT_ACTIONS = 50
MAX_ACTIONS = 500
ACTION_PARAMETERS = ("limit", "before", "actor", "action", "since", "until")
ACTION_NAMES = ("cancel", "drain", "pause", "probe", "replay", "requeue", "resend", "resume")


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """One page of messages: every filter given must match; ``after`` continues a list."""

    status: str | None = None
    event_type: str | None = None
    endpoint: str | None = None
    ordering_key: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    error: str | None = None
    after: tuple[datetime, UUID] | None = None
    limit: int = DEFAULT_PAGE_SIZE


def parse_message_query(
    given: Mapping[str, str | None], names: Mapping[str, str] = PARAMETER_NAMES
) -> MessageQuery:
    """``given`` (parameter → text, None or "" when absent) as a ``MessageQuery``."""
    values = {name: value for name, value in given.items() if value not in (None, "")}
    unknown = sorted(set(values) - set(MESSAGE_PARAMETERS))
    if unknown:
        raise BadRequestError(f"unknown parameter(s): {', '.join(unknown)}")
    texts = {name: _text(names[name], values.get(name)) for name in MESSAGE_PARAMETERS}
    status = texts["status"]
    if status is not None and status not in {str(s) for s in Status}:
        allowed = ", ".join(str(s) for s in Status)
        raise BadRequestError(f"{names['status']} must be one of {allowed}")
    created_from = _time(names["created_from"], texts["created_from"])
    created_to = _time(names["created_to"], texts["created_to"])
    if created_from and created_to and created_from >= created_to:
        raise BadRequestError(f"{names['created_from']} must be earlier than {names['created_to']}")
    return MessageQuery(
        status=status,
        event_type=texts["event_type"],
        endpoint=texts["endpoint"],
        ordering_key=texts["ordering_key"],
        created_from=created_from,
        created_to=created_to,
        error=texts["error"],
        after=_cursor(names["after"], texts["after"]),
        limit=_limit(names["limit"], texts["limit"]),
    )


def cursor(created_at: datetime, message_id: UUID) -> str:
    """The ``after`` of the page that follows a row (in UTC, ``Z``: nothing to escape in a URL)."""
    moment = created_at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return f"{moment}_{message_id}"


def _text(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > MAX_TEXT_CHARS:
        raise BadRequestError(f"{name} is longer than {MAX_TEXT_CHARS} characters")
    if "\x00" in value:
        raise BadRequestError(f"{name} contains a NUL character")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise BadRequestError(f"{name} is not valid UTF-8 text") from None
    return value


def _time(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequestError(
            f"{name} must be an ISO 8601 time, e.g. 2026-01-02T00:00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise BadRequestError(f"{name} needs a UTC offset, e.g. 2026-01-02T00:00:00Z")
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise BadRequestError(f"{name} is out of range") from None
    return moment


def _cursor(name: str, value: str | None) -> tuple[datetime, UUID] | None:
    if value is None:
        return None
    moment, _, identifier = value.rpartition("_")
    try:
        return _cursor_time(moment), UUID(identifier)
    except ValueError:
        raise BadRequestError(f"{name} must be the cursor a previous page gave") from None


def _cursor_time(text: str) -> datetime:
    """A cursor's time: with an offset and, in UTC, within the years 1 to 9999 (what the driver
    sends), a ValueError otherwise (``0001-01-01T00:00:00+14:00`` is a year 0 in UTC)."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError("no offset")
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range") from None
    return moment


def _limit(name: str, value: str | None, most: int = MAX_PAGE_SIZE, default: int = 0) -> int:
    if value is None:
        return default or DEFAULT_PAGE_SIZE
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= most:
        raise BadRequestError(f"{name} must be a whole number from 1 to {most}")
    return int(value)


@dataclass(frozen=True, slots=True)
class ActionQuery:
    """One page of the record of actions, newest first: every filter given must match;
    ``before`` continues a list."""

    limit: int = DEFAULT_ACTIONS
    before: tuple[datetime, str] | None = None
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def parse_action_query(given: Mapping[str, str | None]) -> ActionQuery:
    """``given`` (parameter → text) as an ``ActionQuery``; a bad parameter is named."""
    values = {name: value for name, value in given.items() if value not in (None, "")}
    unknown = sorted(set(values) - set(ACTION_PARAMETERS))
    if unknown:
        raise BadRequestError(f"unknown parameter(s): {', '.join(unknown)}")
    texts = {name: _text(name, values.get(name)) for name in ACTION_PARAMETERS}
    action = texts["action"]
    if action is not None and action not in ACTION_NAMES:
        raise BadRequestError(f"action must be one of {', '.join(ACTION_NAMES)}")
    since, until = _time("since", texts["since"]), _time("until", texts["until"])
    if since and until and since >= until:
        raise BadRequestError("since must be earlier than until")
    return ActionQuery(
        limit=_limit("limit", texts["limit"], MAX_ACTIONS, DEFAULT_ACTIONS),
        before=_action_cursor("before", values.get("before")),
        actor=texts["actor"],
        action=action,
        since=since,
        until=until,
    )


def action_cursor(created_at: datetime, action_id: str) -> str:
    """The ``before`` of the page that follows an action (opaque: base64url of its keys)."""
    keys = json.dumps([created_at.astimezone(UTC).isoformat(), action_id])
    return base64.urlsafe_b64encode(keys.encode()).decode().rstrip("=")


def _action_cursor(name: str, value: str | None) -> tuple[datetime, str] | None:
    if value is None:
        return None
    wrong = f"{name} must be the cursor a previous page gave (its next)"
    try:
        keys = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        raise BadRequestError(wrong) from None
    if not (isinstance(keys, list) and len(keys) == 2 and all(isinstance(k, str) for k in keys)):
        raise BadRequestError(wrong)
    try:
        return _cursor_time(keys[0]), _text(name, keys[1]) or ""
    except ValueError:
        raise BadRequestError(wrong) from None
