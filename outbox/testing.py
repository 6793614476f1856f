"""Helpers for your own tests: what a transaction enqueued, and what a receiver would get.

In a test of your service (any driver ``outbox.enqueue`` takes)::

    from outbox import testing

    async with conn.transaction():
        await complete_order(conn, order_id=42)            # your code, which enqueues
        [event] = await testing.assert_enqueued(conn, "OrderCompleted", {"orderId": 42})

The assertion reads the rows the caller's own transaction sees, before it commits; a payload to
match is a dict (equal), a callable (true for the payload), or ``testing.ANY``.

In a test of your receiver, the exact request the relay would send for a message, signed::

    request = testing.webhook(event, secret="whsec_…")
    response = await client.post("/hooks/orders", data=request.body, headers=request.headers)

And end to end, the real relay run once against a database, delivering to callables or to URLs
of your test (``drain``): what each endpoint received, verifiable with ``outbox.inbox.verify``.

The pytest fixtures are opt-in: ``pytest_plugins = ["outbox.pytest_plugin"]`` in your
``conftest.py`` (``outbox.pytest_plugin``). docs/testing.md has the whole story.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.producer.drivers import async_driver, sync_driver
from outbox.store.caller import enqueued_messages


class _Any:
    """Matches any payload."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
PayloadMatch = Mapping[str, Any] | Callable[[dict[str, Any]], bool] | _Any


@dataclass(frozen=True)
class Enqueued:
    """One outbox message as the caller's transaction sees it."""

    message_id: uuid.UUID
    event_type: str
    payload: dict[str, Any]
    ordering_key: str | None
    status: str
    created_at: datetime
    payload_text: str  # as stored, spliced into the webhook's body unchanged

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Enqueued:
        message_id, event_type, text, key, status, created = row
        identifier = message_id if isinstance(message_id, uuid.UUID) else uuid.UUID(str(message_id))
        return cls(identifier, event_type, json.loads(text), key, status, created, text)


@dataclass(frozen=True)
class Webhook:
    """A request as the relay sends it: its body and Standard Webhooks headers."""

    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


# --- What a transaction enqueued -----------------------------------------------------------


async def enqueued(conn: object, event_type: str | None = None) -> list[Enqueued]:
    """The messages ``conn`` sees (its transaction's own included), oldest first."""
    rows = await async_driver(conn, "enqueue").rows(enqueued_messages(event_type))
    return [Enqueued.from_row(row) for row in rows]


def enqueued_sync(conn: object, event_type: str | None = None) -> list[Enqueued]:
    """``enqueued`` for a synchronous connection or session (psycopg, SQLAlchemy)."""
    rows = sync_driver(conn, "enqueue").rows(enqueued_messages(event_type))
    return [Enqueued.from_row(row) for row in rows]


async def assert_enqueued(
    conn: object,
    event_type: str,
    payload: PayloadMatch = ANY,
    *,
    ordering_key: str | None | _Any = ANY,
    count: int = 1,
) -> list[Enqueued]:
    """Assert that exactly ``count`` messages of ``event_type`` matching ``payload`` (and
    ``ordering_key``) were enqueued; returns them. The failure lists what was enqueued."""
    return _checked(await enqueued(conn), event_type, payload, ordering_key, count)


def assert_enqueued_sync(
    conn: object,
    event_type: str,
    payload: PayloadMatch = ANY,
    *,
    ordering_key: str | None | _Any = ANY,
    count: int = 1,
) -> list[Enqueued]:
    """``assert_enqueued`` for a synchronous connection or session."""
    return _checked(enqueued_sync(conn), event_type, payload, ordering_key, count)


async def refute_enqueued(conn: object, event_type: str | None = None) -> None:
    """Assert that nothing (of ``event_type``) was enqueued."""
    found = await enqueued(conn, event_type)
    if found:
        raise AssertionError(f"expected nothing enqueued, found:\n{_listing(found)}")


def _checked(
    found: list[Enqueued],
    event_type: str,
    payload: PayloadMatch,
    ordering_key: str | None | _Any,
    count: int,
) -> list[Enqueued]:
    matching = [
        m
        for m in found
        if m.event_type == event_type
        and _matches(m.payload, payload)
        and (isinstance(ordering_key, _Any) or m.ordering_key == ordering_key)
    ]
    if len(matching) != count:
        wanted = f"{count} {event_type} with payload {payload!r}"
        if not isinstance(ordering_key, _Any):
            wanted += f" and ordering key {ordering_key!r}"
        raise AssertionError(
            f"expected {wanted}; found {len(matching)} among:\n{_listing(found) or '  (none)'}"
        )
    return matching


def _matches(payload: dict[str, Any], wanted: PayloadMatch) -> bool:
    if isinstance(wanted, _Any):
        return True
    if callable(wanted):
        return bool(wanted(payload))
    return payload == dict(wanted)


def _listing(messages: Sequence[Enqueued]) -> str:
    return "\n".join(
        f"  {m.event_type} {json.dumps(m.payload, sort_keys=True)}"
        + (f" (ordering key {m.ordering_key!r})" if m.ordering_key is not None else "")
        for m in messages
    )


# --- What a receiver gets ------------------------------------------------------------------


def webhook(
    message: Enqueued, *, secret: str | Sequence[str] | None = None, now: float | None = None
) -> Webhook:
    """The request the relay sends for ``message``: the same body, byte for byte, and its
    headers, signed with ``secret`` (``whsec_…``; several for a rotation; None: unsigned) at
    ``now`` (seconds since the epoch; default: this process's clock)."""
    from outbox.core.models import LeasedMessage  # noqa: PLC0415 - only for this call
    from outbox.core.settings import decode_secret  # noqa: PLC0415
    from outbox.core.signing import Signer  # noqa: PLC0415
    from outbox.transport.publisher import build_body, build_headers  # noqa: PLC0415

    leased = LeasedMessage(
        message.message_id,
        message.event_type,
        message.payload_text,
        len(message.payload_text.encode()),
        1,
        uuid.uuid4(),
        message.created_at,
        message.ordering_key,
    )
    body = build_body(leased, message.payload_text)
    secrets = [secret] if isinstance(secret, str) else list(secret or [])
    keys = [decode_secret(part) for one in secrets for part in one.split()]
    return Webhook(build_headers(Signer(keys), str(message.message_id), body, now), body)


@dataclass
class Received:
    """One request an endpoint of ``drain`` got."""

    event_type: str
    endpoint: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Received], Awaitable[int | None] | int | None]


@dataclass
class _Receiver:
    handlers: Mapping[str, Handler]
    received: list[Received] = field(default_factory=list)
    port: int = 0

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[_Receiver]:
        from aiohttp import web  # noqa: PLC0415 - only for drain()

        async def handle(request: web.Request) -> web.Response:
            event_type = request.match_info["event_type"]
            got = Received(event_type, event_type, dict(request.headers), await request.read())
            self.received.append(got)
            status = self.handlers[event_type](got)
            if asyncio.iscoroutine(status) or isinstance(status, Awaitable):
                status = await status
            return web.Response(status=status or 204)

        app = web.Application()
        app.router.add_post("/{event_type}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        try:
            yield self
        finally:
            await runner.cleanup()


async def drain(
    database_url: str,
    to: Mapping[str, Handler | str],
    *,
    secret: str | None = None,
    **settings: Any,
) -> list[Received]:
    """Run the real relay once over ``database_url`` (committed messages only: the relay is
    another session), delivering each event type's messages to its handler in ``to`` (a
    callable given the request, answering a status: None is 204) or to a URL of your own.
    Returns what the callables received, in order. ``settings`` are the relay's own
    (``max_attempts=1``, …)."""
    from outbox.core.settings import Settings  # noqa: PLC0415 - the relay only for this call
    from outbox.relay.runtime import Relay  # noqa: PLC0415

    handlers = {t: h for t, h in to.items() if not isinstance(h, str)}
    async with _Receiver(handlers).serving() as receiver:
        webhooks: dict[str, Any] = {}
        for event_type, target in to.items():
            url = target if isinstance(target, str) else f"http://127.0.0.1:{receiver.port}/"
            url += "" if isinstance(target, str) else event_type
            webhooks[event_type] = {"url": url, **({"secret": secret} if secret else {})}
        relay = await Relay.open(
            Settings.load(database_url=database_url, webhooks=webhooks, **settings)
        )
        try:
            await relay.processor.execute()
        finally:
            await relay.close()
        return receiver.received
