"""The consumer's side: check a webhook's signature, and process each event once.

The relay delivers at least once, so a receiver sees some events twice (after a crash, a lost
answer, a timeout). It records each webhook id it processes in ``outbox_inbox`` in the same
transaction as the business change, and skips the ids it has already recorded::

    event = outbox.inbox.verify(body, headers, secret)      # InvalidSignature: answer 401
    async with conn.transaction():
        if await outbox.inbox.claim(conn, event.id):         # False: processed already
            await conn.execute("INSERT INTO shipments ...", event.data["orderId"])
    # answer 2xx in both cases: the relay stops sending it

``python -m outbox migrate --inbox`` creates the table; ``outbox.sync.claim`` is ``claim`` for
synchronous connections.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from outbox import store
from outbox.core import signing
from outbox.core.errors import ConfigurationError, InvalidSignature, TransactionRequiredError
from outbox.core.settings import decode_secret
from outbox.producer import drivers
from outbox.producer.core import outside_transaction

__all__ = ["InvalidSignature", "WebhookEvent", "claim", "verify"]

# How far a request's webhook-timestamp may be from this host's clock, either way.
TOLERANCE_SECONDS = 5 * 60
MAX_WEBHOOK_ID_CHARS = 255
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class WebhookEvent(BaseModel):
    """A verified webhook: its ``webhook-id`` and the body's ``type``, ``timestamp`` (when the
    event was enqueued) and ``data`` (the payload)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    type: str
    timestamp: AwareDatetime
    data: dict[str, Any]


def verify(
    body: bytes | str, headers: Mapping[str, str], secret: str | Iterable[str]
) -> WebhookEvent:
    """The event of a Standard Webhooks request, once its signature and timestamp check out.

    ``headers`` in any case (a dict, aiohttp's or Azure Functions' headers). ``secret`` is one
    ``whsec_…`` secret, several separated by spaces, or a list of them: during a rotation the
    request is valid if any of them signed it. The ``webhook-timestamp`` must be within five
    minutes of this host's clock, either way. Raises InvalidSignature for a request that fails
    any check (answer it 4xx), ConfigurationError for a ``secret`` that is not a valid one; the
    messages never contain a secret.
    """
    keys = _keys(secret)
    raw = body.encode() if isinstance(body, str) else body
    found = {name.lower(): value for name, value in headers.items()}
    webhook_id = _header(found, "webhook-id")
    timestamp = _timestamp(_header(found, "webhook-timestamp"))
    if not signing.matches(keys, webhook_id, timestamp, raw, _header(found, "webhook-signature")):
        raise InvalidSignature("no signature of the request matches the secret")
    return _event(webhook_id, raw)


async def claim(conn: object, webhook_id: str) -> bool:
    """Record ``webhook_id`` in ``outbox_inbox`` inside the transaction the caller has open on
    ``conn`` (any connection or session ``outbox.enqueue`` takes).

    True the first time: process the event in the same transaction. False when the id is already
    recorded by a committed transaction: skip it, and still answer 2xx. A concurrent claim of the
    same id waits for the first transaction to end: False if it commits, True if it rolls back.
    Outside a transaction it raises TransactionRequiredError; a ``webhook_id`` that cannot be an
    id (empty, too long, control characters) raises ValueError, before anything is written.
    """
    driver = drivers.async_driver(conn, "claim")
    check_webhook_id(webhook_id)
    if await driver.autocommits():
        raise TransactionRequiredError(outside_transaction("claim", driver.begin_hint))
    return await driver.returns_row(store.claim_inbox(webhook_id))


def check_webhook_id(webhook_id: object) -> None:
    """Refuse, before the database does (aborting the caller's transaction), what no id is."""
    if not isinstance(webhook_id, str) or not 0 < len(webhook_id) <= MAX_WEBHOOK_ID_CHARS:
        raise ValueError(
            f"webhook_id must be a non-empty string of at most {MAX_WEBHOOK_ID_CHARS} characters"
        )
    if not webhook_id.isprintable():  # control and format characters, and surrogates
        raise ValueError("webhook_id must be printable text (no control characters or surrogates)")


def _keys(secret: str | Iterable[str]) -> list[bytes]:
    parts = secret.split() if isinstance(secret, str) else [p for s in secret for p in s.split()]
    if not parts:
        raise ConfigurationError("verify needs a webhook secret (whsec_…); none was given")
    try:
        return [decode_secret(part) for part in parts]
    except ValueError as exc:  # its message never quotes the secret
        raise ConfigurationError(f"invalid webhook secret: {exc}") from None


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if not value:
        raise InvalidSignature(f"the request has no {name} header")
    return value


def _timestamp(text: str) -> int:
    if not _TIMESTAMP.fullmatch(text):
        raise InvalidSignature("webhook-timestamp is not a number of seconds")
    timestamp = int(text)
    if abs(time.time() - timestamp) > TOLERANCE_SECONDS:
        raise InvalidSignature(
            "webhook-timestamp is more than 5 minutes away from this host's clock (a replayed "
            "or delayed request, or a clock out of sync)"
        )
    return timestamp


def _event(webhook_id: str, body: bytes) -> WebhookEvent:
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        raise InvalidSignature("the signed body is not JSON") from None
    if not isinstance(fields, dict):
        raise InvalidSignature("the signed body is not a JSON object")
    if fields.get("id", webhook_id) != webhook_id:
        raise InvalidSignature("the body's id is not the request's webhook-id")
    try:
        return WebhookEvent.model_validate({**fields, "id": webhook_id})
    except ValidationError as exc:
        problems = sorted({".".join(map(str, e["loc"])) for e in exc.errors()})
        raise InvalidSignature(
            f"the signed body is not a webhook event ({', '.join(problems)}: missing or invalid)"
        ) from None
