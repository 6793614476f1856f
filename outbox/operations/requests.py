"""What the operations endpoints and commands are asked for, validated in one place: requeue,
replay and drain (``RequeueRequest``, ``ReplayRequest``, ``DrainRequest``), the console's actions
(``action_body``, ``resend_body``, ``cancel_body``) and the endpoint an action names
(``key_of``). The lists' query strings are ``list_query``'s.

The HTTP functions read these from JSON bodies and query strings, the commands from their
flags. Strict: only JSON's own types are accepted (``"yes"`` is not a boolean, ``5`` not a time),
and an unknown field is an error. Each front end says what is wrong in its own words: the rules
name fields through the names it passes in (``message_ids`` for a body, ``--id`` for a command).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Self, TypeVar
from uuid import UUID

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from outbox.core.errors import BadRequestError, NotFoundError

HTTP_MAX_BUDGET_SECONDS = 120.0
# A cancel's reason, kept in each message's last_error.
MAX_REASON_CHARS = 200
MAX_ACTION_ID_CHARS = 100
TOO_LONG_ID = f"must be at most {MAX_ACTION_ID_CHARS} characters"
# Names an error lists at most, of those configured.
NAMED_CONFIGURED = 20
# The most Failed rows one call of a requeue in batches sets back to Pending.
MAX_REQUEUE_BATCH = 10_000

# What each field must be, said after its name when it is of the wrong kind.
MUST_BE = {
    "message_ids": "must be a non-empty list of message ids (UUIDs)",
    "event_type": "must be a non-empty string",
    "created_from": "must be an ISO 8601 time",
    "created_to": "must be an ISO 8601 time",
    "all_failed": "must be true or false",
    "dry_run": "must be true or false",
    "budget_seconds": "must be a number of seconds",
    "endpoint": "must be an endpoint's name",
    "error": "must be a non-empty string",
    "action_id": "must be a non-empty string",
    "batch_size": f"must be a whole number from 1 to {MAX_REQUEUE_BATCH}",
    "reason": f"must be a non-empty string of at most {MAX_REASON_CHARS} characters",
}
# A body's fields are named as they are written.
FIELD_NAMES: Mapping[str, str] = {name: name for name in MUST_BE}
# The commands' flags for the same fields.
FLAG_NAMES: Mapping[str, str] = {
    "message_ids": "--id",
    "event_type": "--event-type",
    "created_from": "--created-from",
    "created_to": "--created-to",
    "all_failed": "--all-failed",
    "dry_run": "--dry-run",
    "budget_seconds": "--budget",
    "endpoint": "--endpoint",
    "error": "--error",
    "action_id": "--action-id",
    "batch_size": "--batch-size",
    "reason": "--reason",
}


def _message_ids(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(MUST_BE["message_ids"])
    try:
        return tuple(item if isinstance(item, UUID) else UUID(str(item)) for item in value)
    except ValueError:
        raise ValueError(MUST_BE["message_ids"]) from None


def _text(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(MUST_BE["event_type"])
    return value


def _time(value: Any) -> Any:
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise ValueError(MUST_BE["created_from"])
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(MUST_BE["created_from"]) from None


def _seconds(value: Any) -> Any:
    """A number (JSON's, or a query string's text) as a float; ``True`` is no number here."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(MUST_BE["budget_seconds"])
    try:
        return float(value)
    except ValueError:
        raise ValueError(MUST_BE["budget_seconds"]) from None
    except OverflowError:  # a JSON integer too large for a float: out of range, like 1e400
        return math.inf


MessageIds = Annotated[tuple[UUID, ...] | None, BeforeValidator(_message_ids)]
Text = Annotated[str | None, BeforeValidator(_text)]
Time = Annotated[datetime | None, BeforeValidator(_time)]
Seconds = Annotated[float | None, BeforeValidator(_seconds)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class RequeueFilter:
    """Which Failed messages to requeue: every given criterion must match (unchecked; the
    operation checks it as a ``RequeueRequest``)."""

    message_ids: tuple[UUID, ...] | None = None
    event_type: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    all_failed: bool = False
    endpoint: str | None = None  # its failures alone, and only it sent them again
    error: str | None = None  # those whose last_error holds this text


class RequeueRequest(_Request):
    """Which Failed messages to set back to Pending: every given criterion must match."""

    message_ids: MessageIds = None
    event_type: Text = None
    created_from: Time = None
    created_to: Time = None
    all_failed: bool = False
    endpoint: Text = None
    error: Text = None
    dry_run: bool = False
    # Chosen by the client: the same requeue sent again (a repeated click, a retry) runs once.
    action_id: Text = None
    # One batch of at most this many rows per call, going on from the last batch of action_id.
    batch_size: int | None = None

    @property
    def filter(self) -> RequeueFilter:
        return RequeueFilter(
            self.message_ids,
            self.event_type,
            self.created_from,
            self.created_to,
            self.all_failed,
            self.endpoint,
            self.error,
        )

    @field_validator("event_type", "endpoint", "error", "action_id")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # A bad request, not a database error: text PostgreSQL cannot hold.
        return _storable(value)

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_REQUEUE_BATCH:
            raise ValueError(MUST_BE["batch_size"])
        return value

    @model_validator(mode="after")
    def _clear(self, info: ValidationInfo) -> Self:
        names = _names(info)
        if self.action_id is not None and len(self.action_id) > MAX_ACTION_ID_CHARS:
            raise ValueError(f"{names['action_id']} {TOO_LONG_ID}")
        if self.batch_size is not None and self.action_id is None and not self.dry_run:
            raise ValueError(
                f"{names['batch_size']} needs {names['action_id']}: each batch goes on from "
                "the last one of that action"
            )
        narrowed = any(
            value is not None
            for value in (
                self.message_ids,
                self.event_type,
                self.created_from,
                self.created_to,
                self.endpoint,
                self.error,
            )
        )
        if narrowed == self.all_failed:
            raise ValueError(
                f"say which Failed messages to requeue: {names['message_ids']}, "
                f"{names['event_type']}, {names['endpoint']}, {names['error']} and/or "
                f"{names['created_from']}/{names['created_to']}, "
                f"or {names['all_failed']} (but not both)"
            )
        check_times(self.created_from, self.created_to, names)
        return self


def check_times(
    created_from: datetime | None, created_to: datetime | None, names: Mapping[str, str]
) -> None:
    """A ValueError unless each time given has an offset, is in range in UTC, and ``from`` comes
    before ``to`` (worded by ``names``)."""
    # Offsets first: a naive and an aware time cannot even be compared.
    for field, value in (("created_from", created_from), ("created_to", created_to)):
        if value is None:
            continue
        if value.tzinfo is None:
            raise ValueError("times need a UTC offset, e.g. 2026-01-02T00:00:00Z")
        try:
            value.astimezone(UTC)  # what the driver sends; it must stay a valid datetime
        except OverflowError:
            raise ValueError(
                f"{names[field]} is out of range: in UTC it must fall within the years 1 to 9999"
            ) from None
    if created_from and created_to and created_from >= created_to:
        raise ValueError(f"{names['created_from']} must be earlier than {names['created_to']}")


def _storable(value: str | None) -> str | None:
    """``value`` unless PostgreSQL cannot hold it as text (a bad request, not a database error)."""
    if value is not None and "\x00" in value:
        raise ValueError("contains a NUL character (\\u0000)")
    if value is not None:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("is not valid UTF-8 text (it holds a lone surrogate)") from None
    return value


class ReplayRequest(_Request):
    """Which Processed messages to send again: those created in the window [``created_from``,
    ``created_to``) (required), of ``event_type`` and for ``endpoint`` alone (each when given)."""

    event_type: Text = None
    endpoint: Text = None
    created_from: Time = None
    created_to: Time = None
    dry_run: bool = False
    action_id: Text = None

    @field_validator("event_type", "endpoint", "action_id")
    @classmethod
    def _text_fields(cls, value: str | None) -> str | None:
        return _storable(value)

    @model_validator(mode="after")
    def _window(self, info: ValidationInfo) -> Self:
        names = _names(info)
        if self.created_from is None or self.created_to is None:
            raise ValueError(
                f"{names['created_from']} and {names['created_to']} are required: the window "
                "of creation times whose Processed messages are sent again"
            )
        if self.action_id is not None and len(self.action_id) > MAX_ACTION_ID_CHARS:
            raise ValueError(f"{names['action_id']} {TOO_LONG_ID}")
        check_times(self.created_from, self.created_to, names)
        return self


class DrainRequest(_Request):
    """A drain by hand: how long it may lease and start deliveries."""

    budget_seconds: Seconds = None

    @field_validator("budget_seconds")
    @classmethod
    def _in_range(cls, value: float | None) -> float | None:
        # HTTP requests on Azure are cut off after 230 s; a drain also needs up to one HTTP
        # timeout to finish the requests in flight when its budget ends.
        if value is not None and not (
            math.isfinite(value) and 0 < value <= HTTP_MAX_BUDGET_SECONDS
        ):
            raise ValueError(f"must be greater than 0 and at most {HTTP_MAX_BUDGET_SECONDS:g}")
        return value


R = TypeVar("R", bound=_Request)


def parse(
    model: type[R],
    data: Mapping[str, Any],
    *,
    names: Mapping[str, str] = FIELD_NAMES,
    unknown: str = "unknown field(s): {}",
) -> R:
    """``data`` as a ``model``, or a BadRequestError that says what is wrong in ``names``
    (``unknown`` words the fields the model does not have)."""
    try:
        return model.model_validate(data, context={"names": names})
    except ValidationError as exc:
        raise BadRequestError(explain(exc, names, unknown)) from None


def explain(error: ValidationError, names: Mapping[str, str], unknown: str) -> str:
    """The first problem of ``error`` in one line, with fields called by ``names``."""
    problems = error.errors(include_url=False, include_context=False, include_input=False)
    extra = sorted(str(p["loc"][0]) for p in problems if p["type"] == "extra_forbidden")
    if extra:
        return unknown.format(", ".join(extra))
    first = problems[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if not first["loc"]:
        return message  # a rule across fields: it names them itself
    field = str(first["loc"][0])
    if first["type"] != "value_error":
        message = MUST_BE.get(field, "is not valid")
    return f"{names.get(field, field)} {message}"


def _names(info: ValidationInfo) -> Mapping[str, str]:
    context = info.context if isinstance(info.context, Mapping) else {}
    names: Mapping[str, str] = context.get("names", FIELD_NAMES)
    return names


# Each event type's endpoint names, as configured (``Settings.endpoint_names``).
Endpoints = Mapping[str, Sequence[str]]
# The fields of the console's action bodies (pause, resume, probe; resend; cancel).
ACTION_FIELDS = frozenset({"event_type", "endpoint", "action_id"})
RESEND_FIELDS = frozenset({"message_ids", "endpoint", "action_id", "dry_run"})
CANCEL_FIELDS = frozenset({"message_ids", "reason", "action_id", "dry_run"})


def action_body(data: Mapping[str, Any], fields: frozenset[str] = ACTION_FIELDS) -> dict[str, Any]:
    """A console action's body (a JSON object), with no field but ``fields`` and a usable
    ``action_id`` if it has one."""
    unknown = sorted(set(data) - fields)
    if unknown:
        raise BadRequestError(f"unknown field(s) in the body: {', '.join(unknown)}")
    action_id = data.get("action_id")
    if action_id is not None and (
        not isinstance(action_id, str) or not 0 < len(action_id) <= MAX_ACTION_ID_CHARS
    ):
        raise BadRequestError(
            f"action_id must be a string of 1 to {MAX_ACTION_ID_CHARS} characters"
        )
    if action_id is not None:
        _text_field("action_id", action_id)
    dry_run = data.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadRequestError(f"dry_run {MUST_BE['dry_run']}")
    return dict(data)


def message_ids_of(data: Mapping[str, Any]) -> list[UUID]:
    """The body's ``message_ids``: a non-empty list of message ids, each a UUID's text."""
    given = data.get("message_ids")
    wrong = f"message_ids {MUST_BE['message_ids']}"
    if not isinstance(given, list) or not given or not all(isinstance(i, str) for i in given):
        raise BadRequestError(wrong)
    try:
        return [UUID(i) for i in given]
    except ValueError:
        raise BadRequestError(wrong) from None


def resend_body(data: Mapping[str, Any]) -> tuple[list[UUID], str | None]:
    """A resend's message ids and endpoint (None: every endpoint), from its body's fields."""
    ids = message_ids_of(data)
    endpoint = data.get("endpoint")
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
        raise BadRequestError("endpoint must be an endpoint's name")
    if endpoint is not None:
        _text_field("endpoint", endpoint)
    return ids, endpoint


def cancel_body(data: Mapping[str, Any]) -> tuple[list[UUID], str]:
    """A cancel's message ids and reason, from its body's fields."""
    return message_ids_of(data), cancel_reason(data.get("reason"))


def cancel_reason(reason: Any, name: str = "reason") -> str:
    """Why messages are cancelled (kept in their last_error): 1 to ``MAX_REASON_CHARS``
    characters of text, ``name`` naming the field or flag in an error."""
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise BadRequestError(f"{name} {MUST_BE['reason']}: why they are cancelled")
    _text_field(name, reason)
    return reason.strip()


def _text_field(name: str, value: str) -> None:
    try:
        _storable(value)
    except ValueError as exc:
        raise BadRequestError(f"{name} {exc}") from None


def key_of(endpoints: Endpoints, event_type: Any, endpoint: Any) -> tuple[str, str]:
    """The (event type, endpoint) an action names, checked against the configuration: one that
    is not configured is a ``NotFoundError`` that lists those that are."""
    if not isinstance(event_type, str) or not event_type:
        raise BadRequestError("event_type must be an event type")
    if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
        raise BadRequestError("endpoint must be an endpoint's name")
    configured = endpoints.get(event_type)
    if not configured:
        raise NotFoundError(
            f"no endpoint of event type {event_type!r} "
            f"(configured: {_listed(list(endpoints)) or 'none'})"
        )
    if endpoint is None and len(configured) == 1:
        return event_type, configured[0]  # an event type's only endpoint needs no name
    if endpoint is None:
        raise BadRequestError(
            f"endpoint must be one of {_listed(configured)} (event type {event_type!r} has several)"
        )
    if endpoint not in configured:
        raise NotFoundError(
            f"no endpoint {endpoint!r} of event type {event_type!r} "
            f"(configured: {_listed(configured)})"
        )
    return event_type, endpoint


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED_CONFIGURED])
    more = len(names) - NAMED_CONFIGURED
    return shown + (f" and {more} more" if more > 0 else "")
