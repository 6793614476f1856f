"""The producer side: ``enqueue`` inside the caller's transaction, ``notify`` after the commit.

::

    async with conn.transaction():
        await conn.execute("UPDATE orders SET status = 'completed' WHERE id = $1", order_id)
        await outbox.enqueue(conn, "OrderCompleted", {"orderId": order_id})
    await outbox.notify(queue)          # after the commit; never raises

or, doing both::

    async with outbox.transaction(conn, queue) as tx:
        await conn.execute(...)
        await tx.enqueue("OrderCompleted", {"orderId": order_id})

``conn`` is an asyncpg connection, a ``psycopg.AsyncConnection`` or a SQLAlchemy ``AsyncSession``
or ``AsyncConnection`` (``outbox.drivers``); ``outbox.sync`` has the same for synchronous ones.
This module is the core they share: validation and serialisation before anything is written, and
the one INSERT.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import logging
import re
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from outbox import store
from outbox.core import telemetry
from outbox.core.environment import DEFAULT_MAX_PAYLOAD_BYTES, payload_limit, wakes_by_postgres
from outbox.core.errors import (
    ConfigurationError,
    DuplicateMessageError,
    InvalidMessageError,
    TransactionRequiredError,
    describe,
)
from outbox.core.ids import new_message_id
from outbox.core.text import first_control
from outbox.producer import drivers

if TYPE_CHECKING:
    # pydantic is loaded by a producer whose payloads are its models (``_is_model``), and the
    # wake-up queue's client only where a hint goes to the queue: neither the Azure Storage SDK
    # (with aiohttp under it) nor pydantic is part of a producer's import.
    from pydantic import BaseModel
    from typing_extensions import TypeIs

    from outbox.transport.wakeup import WakeUpQueue

logger = logging.getLogger("outbox.producer")
Payload: TypeAlias = "Mapping[str, Any] | BaseModel"
MAX_EVENT_TYPE_CHARS = 200
MAX_KEY_CHARS = 200
# json.dumps writes U+0000 as \u0000, and a literal backslash as \\: only an odd run of backslashes
# before "u0000" is an escaped NUL (an even run is the text backslash-u0000, which is fine).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# A number json.dumps writes with an exponent (1e+300, from a float); jsonb's text, which the
# relay measures against the limit, writes it in full (301 digits). Strings are matched first, so
# that "3e8" inside one is not taken for a number.
_EXPONENT = re.compile(r"\d[eE][+-]?\d")
_STRING_OR_EXPONENT_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|(-?\d+(?:\.\d+)?[eE][+-]?\d+)')


async def enqueue(
    conn: object,
    event_type: str,
    payload: Payload,
    *,
    message_id: uuid.UUID | None = None,
    ordering_key: str | None = None,
    max_payload_bytes: int | None = None,
) -> uuid.UUID:
    """Insert a Pending outbox row on ``conn``, inside the transaction the caller has open.

    ``conn`` is an asyncpg connection (or pool connection), a ``psycopg.AsyncConnection``, or a
    SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` (asyncpg or psycopg driver); the same row
    is written through each. Outside a transaction it raises TransactionRequiredError.

    The payload (a dict or a pydantic model) is checked and serialised before anything is written,
    so a bad payload raises InvalidMessageError and leaves the caller's transaction usable.
    Returns the message id, which receivers see as ``webhook-id`` and use to drop duplicates.

    Messages with the same ``ordering_key`` (e.g. ``"order-42"``) are delivered one at a time in
    enqueue order: one is not sent while an earlier one with the key is still waiting or retrying.
    Messages without a key are delivered in parallel.

    A payload larger than ``max_payload_bytes`` (by default ``OUTBOX_MAX_PAYLOAD_BYTES`` from the
    environment, else 1 MiB, the relay's own default) is refused.
    """
    driver = drivers.async_driver(conn, "enqueue")
    message_id, statement = prepare(
        event_type, payload, message_id, ordering_key, max_payload_bytes
    )
    if await driver.autocommits():
        raise TransactionRequiredError(outside_transaction("enqueue", driver.begin_hint))
    with drivers.outdated_schema_errors():
        inserted = await driver.returns_row(statement)
    if not inserted:
        raise DuplicateMessageError(f"outbox message {message_id} already exists")
    return message_id


def prepare(
    event_type: str,
    payload: Payload,
    message_id: uuid.UUID | None,
    ordering_key: str | None,
    max_payload_bytes: int | None,
) -> tuple[uuid.UUID, store.Statement]:
    """The message's id and its INSERT, or InvalidMessageError (or ConfigurationError, for a bad
    ``OUTBOX_MAX_PAYLOAD_BYTES``) before anything is written: what every driver's enqueue does
    first."""
    check_event_type(event_type)
    check_ordering_key(ordering_key)
    limit = payload_limit() if max_payload_bytes is None else max_payload_bytes
    body = serialise_payload(payload, limit)
    generated = message_id is None
    message_id = message_id or new_message_id()
    # The producer's trace (its active span), continued by the delivery; None without one.
    trace_context = telemetry.capture()
    return message_id, store.insert_message(
        message_id, event_type, body, ordering_key, trace_context, generated_id=generated
    )


def outside_transaction(operation: str, begin_hint: str) -> str:
    """Why ``operation`` (enqueue, claim) refuses to run where its statement would commit alone."""
    return (
        f"{operation} must run inside the transaction that writes your business rows "
        f"({begin_hint}), or it would not be atomic with them"
    )


def nested_transaction(prefix: str) -> str:
    """Why ``transaction()`` (of ``outbox`` or ``outbox.sync``) refuses to run inside another."""
    return (
        f"{prefix}.transaction opens and commits the transaction itself; inside a transaction "
        f"of your own, call {prefix}.enqueue(...) in it and {prefix}.notify(...) after its commit"
    )


async def notify(queue: WakeUpQueue | None = None, *, conn: object | None = None) -> bool:
    """Send the wake-up hint after the commit. Never raises; returns whether it was sent.

    Pass a long-lived ``WakeUpQueue`` to reuse its connection; without one, a client is made from
    the environment (``AzureWebJobsStorage``, ``OUTBOX_QUEUE_NAME``) for this one hint. With
    ``OUTBOX_WAKEUP=postgres`` the hint is a NOTIFY sent on ``conn`` (the connection or session
    that committed) in a transaction of its own
    (docs/performance.md#wake-ups-over-postgresql).
    """
    if queue is not None:
        return await queue.notify()
    if not over_postgres():
        from outbox.transport.wakeup import notify_once  # noqa: PLC0415 - see the imports

        return await notify_once()
    if conn is None:
        logger.warning(NEEDS_CONNECTION)
        return False
    try:
        driver = drivers.async_driver(conn, "notify")
        async with driver.transaction():
            await driver.returns_row(store.wakeup_statement())
    except Exception as exc:  # noqa: BLE001 - a hint must never fail the caller
        logger.warning(NOT_SENT, describe(exc))
        return False
    return True


NEEDS_CONNECTION = (
    "outbox wake-up not sent (the row is safe): with OUTBOX_WAKEUP=postgres, notify() needs the "
    "connection that committed: notify(conn=conn)"
)
NOT_SENT = "outbox wake-up NOTIFY not sent (the row is safe): %s"


def over_postgres() -> bool:
    """Whether wake-ups go over PostgreSQL (OUTBOX_WAKEUP=postgres). A bad value is a warning
    here, and the queue's hint is tried (notify never raises)."""
    try:
        return wakes_by_postgres()
    except ConfigurationError as exc:
        logger.warning("outbox wake-up: %s", exc)
        return False


class OutboxTransaction:
    """Handed out by ``transaction()``: enqueues on the transaction's connection."""

    def __init__(self, conn: object, max_payload_bytes: int | None) -> None:
        self._conn = conn
        self._max_payload_bytes = max_payload_bytes
        self.message_ids: list[uuid.UUID] = []

    async def enqueue(
        self,
        event_type: str,
        payload: Payload,
        *,
        message_id: uuid.UUID | None = None,
        ordering_key: str | None = None,
    ) -> uuid.UUID:
        message_id = await enqueue(
            self._conn,
            event_type,
            payload,
            message_id=message_id,
            ordering_key=ordering_key,
            max_payload_bytes=self._max_payload_bytes,
        )
        self.message_ids.append(message_id)
        return message_id


@asynccontextmanager
async def transaction(
    conn: object,
    queue: WakeUpQueue | None = None,
    *,
    max_payload_bytes: int | None = None,
) -> AsyncIterator[OutboxTransaction]:
    """Open a transaction on ``conn`` (any connection or session ``enqueue`` takes); after it
    commits, send one hint if anything was enqueued."""
    driver = drivers.async_driver(conn, "transaction")
    if await driver.in_transaction():
        # Nested, it would only release a savepoint: the hint would beat the commit.
        raise TransactionRequiredError(nested_transaction("outbox"))
    tx = OutboxTransaction(conn, max_payload_bytes)
    async with driver.transaction():
        yield tx
    if tx.message_ids:
        await notify(queue, conn=conn)


# Allowed between two letters or symbols beyond ASCII: a refusal elsewhere names which one.
_JOINERS = {"\u200c": "non-joiner", "\u200d": "joiner"}


def check_event_type(event_type: object) -> None:
    if not isinstance(event_type, str) or not event_type.strip():
        raise InvalidMessageError("event_type must be a non-empty string")
    if len(event_type) > MAX_EVENT_TYPE_CHARS or event_type != event_type.strip():
        raise InvalidMessageError(
            f"event_type must be at most {MAX_EVENT_TYPE_CHARS} characters, without surrounding "
            "spaces"
        )
    check_storable_text("event_type", event_type)


def check_ordering_key(ordering_key: object) -> None:
    if ordering_key is None:
        return
    if not isinstance(ordering_key, str) or not ordering_key or len(ordering_key) > MAX_KEY_CHARS:
        raise InvalidMessageError(
            f"ordering_key must be a non-empty string of at most {MAX_KEY_CHARS} characters"
        )
    check_storable_text("ordering_key", ordering_key)


def check_storable_text(name: str, value: str) -> None:
    """Refuse U+0000 and surrogates here: PostgreSQL would abort the transaction over them. And
    any other control character: an event type or key is a name, which logs and receivers show.
    The zero width joiners are text where they join two letters or symbols (``outbox.text``)."""
    if "\x00" in value:
        raise InvalidMessageError(
            f"{name} contains a NUL character (\\u0000), which PostgreSQL text cannot store"
        )
    _utf8(name, value)
    control = first_control(value)
    if control is None:
        return
    if control in _JOINERS:
        raise InvalidMessageError(
            f"{name} contains a zero width {_JOINERS[control]} (U+{ord(control):04X}) that joins "
            "no two letters or symbols beyond ASCII; remove it"
        )
    raise InvalidMessageError(
        f"{name} contains a control character (U+{ord(control):04X}); use printable text"
    )


def serialise_payload(payload: Payload, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """The payload as JSON object text, or InvalidMessageError saying why it cannot be stored."""
    text = _to_json(payload)
    if not text.startswith("{"):
        raise InvalidMessageError("payload must serialise to a JSON object")
    if _ESCAPED_NUL.search(text):
        raise InvalidMessageError(
            "payload contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store"
        )
    size = stored_size(text, len(_utf8("payload", text)))
    if size > max_bytes:
        raise InvalidMessageError(f"payload is {size} bytes, above the limit of {max_bytes}")
    return text


def stored_size(text: str, utf8_bytes: int) -> int:
    """The size of payload ``text`` as the relay measures it: PostgreSQL's text of the jsonb
    value, which writes a number like 1e+300 in full (``utf8_bytes``: the size of ``text``)."""
    if not _EXPONENT.search(text):
        return utf8_bytes  # the usual case: no number written with an exponent
    size = utf8_bytes
    for match in _STRING_OR_EXPONENT_NUMBER.finditer(text):
        if number := match.group(1):
            size += len(format(decimal.Decimal(number), "f")) - len(number)
    return size


def _to_json(payload: Payload) -> str:
    if not (_is_model(payload) or isinstance(payload, Mapping)):
        raise InvalidMessageError(
            f"payload must be a dict or a pydantic model, not {type(payload).__name__}"
        )
    try:
        # Not model_dump_json: it can write Infinity/NaN (ser_json_inf_nan="constants"), which
        # jsonb refuses. The values are pydantic's own; json.dumps then applies the same checks.
        value = payload.model_dump(mode="json") if _is_model(payload) else dict(payload)
        return json.dumps(value, ensure_ascii=False, allow_nan=False, default=_json_default)
    except RecursionError:
        raise InvalidMessageError("payload is nested too deeply to serialise") from None
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"payload is not JSON-serialisable: {exc}") from None


def _json_default(value: Any) -> Any:
    """The common types json cannot encode itself, encoded the way pydantic would."""
    if _is_model(value):
        return value.model_dump(mode="json")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _is_model(value: object) -> TypeIs[BaseModel]:
    """Whether ``value`` is a pydantic model. A model's class comes from ``pydantic.main``, so
    where that is not loaded, nothing is one, and pydantic is not imported to find that out."""
    main = sys.modules.get("pydantic.main")
    return main is not None and isinstance(value, main.BaseModel)


def _utf8(name: str, text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (e.g. from a surrogateescape decode) cannot be stored."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            f"{name} contains a surrogate (U+{ord(exc.object[exc.start]):04X}), which is not "
            "valid UTF-8 text and cannot be stored"
        ) from None
