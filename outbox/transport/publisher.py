"""Webhook delivery over one shared aiohttp session: build, sign, POST, and report what happened."""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence

import aiohttp
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from outbox.core.logs import Throttled
from outbox.core.models import (
    DeliveryResult,
    LeasedMessage,
    NotAttempted,
    Response,
    TransportError,
    Undeliverable,
)
from outbox.core.redact import Redactor
from outbox.core.resources import Closeable
from outbox.core.settings import Settings, WebhookEndpoint
from outbox.core.signing import Signer
from outbox.core.telemetry import propagate

# At most this much of a response body is kept: enough for an error snippet.
MAX_SNIPPET_BYTES = 512
# Read this much more before cutting, and redact first: a secret echoed across the cut would
# otherwise keep its first half. Still never a 50 MB reply.
REDACTION_SLACK_BYTES = 4096
USER_AGENT = "outbox-relay/0.1"
# The relay short of descriptors, memory or buffers: what failed was this process, not the
# receiver (it was never reached).
OWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
# The relay's own resolver failing (not "no such host", which is the endpoint's URL).
OWN_RESOLVER_ERRORS = frozenset({socket.EAI_AGAIN, socket.EAI_MEMORY})
# A delivery the relay could not make for want of its own resources is due again this soon:
# such shortages pass (an attack on serve's port ends, a burst ends), and no attempt was spent.
OWN_ERROR_RETRY_SECONDS = 5.0
OWN_ERROR_LOG_INTERVAL_SECONDS = 60.0

logger = logging.getLogger("outbox.publisher")


class FreshConnector(aiohttp.TCPConnector):
    """A connector that never hands out a kept-alive connection holding unread bytes.

    A receiver may send more than its answer (a second, unsolicited response) on a keep-alive
    connection. aiohttp parses such bytes as they arrive and queues them, and the next request
    on that connection would take them for its own answer: a 503 read as a stray 200 marks the
    message delivered. Such a connection is closed here, before any request is written on it.
    """

    async def connect(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 - aiohttp's signature
    ) -> Connection:
        while True:
            connection = await super().connect(req, traces, timeout)
            protocol = connection.protocol
            if protocol is None or not protocol.should_close:
                return connection
            connection.close()  # unexpected data arrived while it was idle: never reuse it


EndpointKey = tuple[str, str]  # (event type, endpoint name)


class _Prepared:
    """What every request to one endpoint shares: session, URL, signer, extra headers, timeout."""

    def __init__(
        self, endpoint: WebhookEndpoint, default_timeout: float, session: aiohttp.ClientSession
    ) -> None:
        self.session = session
        self.url = endpoint.url
        self.signer = Signer(endpoint.signing_keys)
        self.headers = {name: value.get_secret_value() for name, value in endpoint.headers.items()}
        self.timeout = aiohttp.ClientTimeout(total=endpoint.timeout(default_timeout))


# A 2xx answer carries nothing but its status: one value per status, made once.
_SUCCESSES = {status: Response(status) for status in range(200, 300)}


def _name(endpoint: WebhookEndpoint) -> str:
    assert endpoint.name is not None  # named by Settings
    return endpoint.name


def make_session(
    settings: Settings, *, limit: int | None = None, timeout: float | None = None
) -> aiohttp.ClientSession:
    """An HTTP session for one endpoint: keep-alive, at most ``limit`` connections (by default
    one per concurrent delivery)."""
    return aiohttp.ClientSession(
        connector=FreshConnector(limit=limit or settings.concurrency, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=timeout or settings.http_timeout_seconds),
        headers={"user-agent": USER_AGENT},
        raise_for_status=False,
    )


def build_body(message: LeasedMessage, payload: str) -> bytes:
    """``{"id", "type", "timestamp", "data"}``; the stored JSON payload is spliced in unchanged."""
    # Formatted by hand (byte for byte what json.dumps would write): a UUID and an ISO 8601
    # timestamp need no escaping, and the event type's JSON string is computed once per type.
    return (
        f'{{"id": "{message.message_id}", "type": {json_string(message.event_type)}, '
        f'"timestamp": "{message.created_at.isoformat()}", "data": {payload}}}'
    ).encode()


@functools.lru_cache(maxsize=1024)
def json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def build_headers(
    signer: Signer, message_id: str, body: bytes, now: float | None = None
) -> dict[str, str]:
    """The Standard Webhooks headers, signed by ``signer`` (no keys: unsigned), for the time
    ``now`` (seconds since the epoch; by default this process's clock)."""
    timestamp = int(time.time() if now is None else now)
    headers = {
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
    }
    if signer:
        headers["webhook-signature"] = signer.sign(message_id, timestamp, body)
    return headers


class Publisher(Closeable):
    """POSTs leased messages to the endpoints of their event type, one endpoint at a time.

    Each endpoint has an HTTP session (and so a connection pool) of its own, with its own
    timeout and headers: a receiver's stray bytes, or a slow or dead endpoint, never touch
    another endpoint's connections.
    """

    def __init__(
        self,
        endpoints: Mapping[str, Sequence[WebhookEndpoint]],
        sessions: Mapping[EndpointKey, aiohttp.ClientSession],
        *,
        timeout_seconds: float,
        max_payload_bytes: int,
        redact: Redactor,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._sessions = sessions
        # Prepared once: the secrets and headers do not change while the process runs.
        self._prepared: dict[EndpointKey, _Prepared] = {}
        for event_type, group in endpoints.items():
            for endpoint in group:
                key = (event_type, _name(endpoint))
                self._prepared[key] = _Prepared(endpoint, timeout_seconds, sessions[key])
        self._max_payload_bytes = max_payload_bytes
        self._redact = redact
        self._own_errors = Throttled(logger, OWN_ERROR_LOG_INTERVAL_SECONDS)

    @classmethod
    def from_settings(cls, settings: Settings, clock: Callable[[], float] = time.time) -> Publisher:
        """A publisher with a session of its own per endpoint (call inside the event loop);
        ``clock`` gives the time its signatures carry (the database's, for the relay)."""
        sessions = {
            (event_type, _name(endpoint)): make_session(
                settings,
                limit=endpoint.max_concurrency,
                timeout=endpoint.timeout(settings.http_timeout_seconds),
            )
            for event_type, group in settings.endpoints.items()
            for endpoint in group
        }
        return cls(
            settings.endpoints,
            sessions,
            timeout_seconds=settings.http_timeout_seconds,
            max_payload_bytes=settings.max_payload_bytes,
            redact=Redactor.from_settings(settings),
            clock=clock,
        )

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()

    def sendable(self, message: LeasedMessage) -> str | Undeliverable:
        """The payload text to send, or why ``message`` can never be delivered as stored."""
        size = message.payload_bytes  # measured by the database: no encoding needed here
        if message.payload is None or size > self._max_payload_bytes:
            return Undeliverable(
                f"payload is {size} bytes, above OUTBOX_MAX_PAYLOAD_BYTES={self._max_payload_bytes}"
            )
        if not message.payload.startswith("{"):
            return Undeliverable(f"payload is JSON {json_kind(message.payload)}, not an object")
        return message.payload

    async def deliver(self, message: LeasedMessage, endpoint: WebhookEndpoint) -> DeliveryResult:
        """One POST of ``message`` to ``endpoint`` (one of its event type's); every exception is
        turned into a result, none escapes."""
        payload = self.sendable(message)
        if isinstance(payload, Undeliverable):
            return payload
        prepared = self._prepared[message.event_type, _name(endpoint)]
        body = build_body(message, payload)
        headers = prepared.headers | build_headers(
            prepared.signer, str(message.message_id), body, self._clock()
        )
        propagate(headers, message.trace_context)  # traceparent (and tracestate)
        try:
            return await self._post(prepared, body, headers)
        except TimeoutError:
            return TransportError(f"timed out after {prepared.timeout.total:g}s", "TimeoutError")
        except aiohttp.ClientResponseError as exc:
            # Its text ends with the URL as the client rewrote it, which redaction cannot match
            # reliably; the status and message say what went wrong.
            name = type(exc).__name__
            return TransportError(self._redact(f"{name}: {exc.status}, {exc.message}"), name)
        except (aiohttp.ClientError, OSError, ValueError, MemoryError) as exc:
            return self._not_answered(exc)

    def _not_answered(self, exc: Exception) -> TransportError | NotAttempted:
        """A transport error, or, when the relay itself failed (``own_error``), a delivery not
        attempted: the receiver was never reached, so nothing counts against it."""
        if (why := own_error(exc)) is None:
            name = type(exc).__name__
            return TransportError(self._redact(f"{name}: {exc}"), name)
        self._own_errors(
            f"deliveries not attempted: {why}; retried in {OWN_ERROR_RETRY_SECONDS:g}s "
            "without spending an attempt or counting against the endpoint's breaker"
        )
        return NotAttempted(f"the relay's own error: {why}", OWN_ERROR_RETRY_SECONDS)

    async def _post(self, prepared: _Prepared, body: bytes, headers: dict[str, str]) -> Response:
        async with prepared.session.post(
            prepared.url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=prepared.timeout,
        ) as response:
            chunk = await response.content.read(MAX_SNIPPET_BYTES + REDACTION_SLACK_BYTES)
            if not response.content.at_eof():
                # Do not drain an unbounded body just to keep the connection: drop it.
                response.close()
            if 200 <= response.status < 300:
                # Only an error's body is ever shown (in last_error); skip decoding and redacting.
                return _SUCCESSES[response.status]
            return Response(
                status=response.status,
                retry_after=response.headers.get("retry-after"),
                snippet=self._redact(chunk.decode("utf-8", errors="replace"))[:MAX_SNIPPET_BYTES],
            )


def own_error(exc: BaseException) -> str | None:
    """Why ``exc`` is the relay's own failure (out of descriptors or memory, its resolver
    failing), or None when it may be the endpoint's. Pure: looks at ``exc`` and its causes."""
    if isinstance(exc, MemoryError):
        return "out of memory (MemoryError)"
    seen: BaseException | None = exc
    for _ in range(8):  # aiohttp wraps the socket's error once or twice; never a long chain
        if seen is None:
            return None
        code = seen.errno if isinstance(seen, OSError) else None
        if isinstance(seen, socket.gaierror) and code in OWN_RESOLVER_ERRORS:
            return f"its resolver failed ({seen.strerror})"
        if code in OWN_ERRNOS and not isinstance(seen, socket.gaierror):
            return f"{os.strerror(code)} ({errno.errorcode[code]})"
        seen = getattr(seen, "os_error", None) or seen.__cause__ or seen.__context__
    return None


def json_kind(text: str) -> str:
    """The JSON type of a jsonb value's text form, from its first character."""
    kinds = {
        "{": "object",
        "[": "array",
        '"': "string",
        "n": "null",
        "t": "boolean",
        "f": "boolean",
    }
    return kinds.get(text[:1], "number")
