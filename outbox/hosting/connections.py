"""What keeps ``outbox serve``'s port from being choked by clients that connect and say nothing.

Anyone who can reach the port can open connections (no key is needed to connect). Left alone,
a thousand idle ones take every file descriptor the process has: the relay can then open no
socket of its own, to a receiver, to the database or to the queue. So:

- a connection must send a whole request's headers within ``header_timeout`` seconds of
  opening, or it is closed (after a request, aiohttp's keep-alive timeout closes it when idle);
- at most ``max_connections`` are open: one more closes the oldest idle one (one that has no
  request in progress), or is itself closed when every other is busy;
- errors accepting a connection (out of descriptors) are logged at most once per interval, with
  how many there were, never a traceback each.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from outbox.core.logs import Throttled
from outbox.core.settings import open_files_limit

# A request's headers are a few hundred bytes: anything slower than this is not a client.
HEADER_TIMEOUT_SECONDS = 10.0
# How long a connection may idle between requests (aiohttp closes it after).
KEEPALIVE_TIMEOUT_SECONDS = 75.0
MAX_CONNECTIONS_CEILING = 1024
# The errors of a listening socket that cannot accept for want of resources.
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_ERROR_LOG_INTERVAL_SECONDS = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_max_connections() -> int:
    """A quarter of the process's descriptor limit, at most 1024: the rest stays for the
    relay's own sockets (receivers, the database pool, the queue) and files."""
    soft = open_files_limit()
    if soft is None:
        return MAX_CONNECTIONS_CEILING
    return max(1, min(MAX_CONNECTIONS_CEILING, soft // 4))


class Guard:
    """Wraps a server's protocol factory (aiohttp's ``web.Server``): counts the open connections,
    caps them, and closes those that send no request in time. Add ``middleware`` to the app: it
    tells the guard which connections have a request in progress."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        *,
        max_connections: int,
        header_timeout: float = HEADER_TIMEOUT_SECONDS,
    ) -> None:
        self._factory = factory
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        # Oldest first (dicts keep insertion order); only connections not yet being closed.
        self._open: dict[GuardedConnection, None] = {}
        self.closed_idle = 0  # closed for sending no request in time
        self.closed_over_cap = 0  # closed to keep the count at the cap

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self, self._factory())

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def opened(self, connection: GuardedConnection) -> None:
        self._open[connection] = None
        if len(self._open) > self.max_connections:
            # The oldest connection without a request in progress; the new one itself when
            # every other is busy (it is idle: it has sent nothing yet).
            victim = next(c for c in self._open if not c.busy)
            self.closed_over_cap += 1
            self.close(victim)

    def close(self, connection: GuardedConnection) -> None:
        if connection in self._open:
            del self._open[connection]
            connection.abort()

    def lost(self, connection: GuardedConnection) -> None:
        self._open.pop(connection, None)

    def headers_due(self, connection: GuardedConnection) -> None:
        if connection.requests == 0 and connection in self._open:
            self.closed_idle += 1
            self.close(connection)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the request's connection busy while its request is handled."""
        transport = request.transport
        connection = transport.get_protocol() if transport is not None else None
        if not isinstance(connection, GuardedConnection):
            return await handler(request)
        connection.started()
        try:
            return await handler(request)
        finally:
            connection.in_progress -= 1


class GuardedConnection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, and what the guard needs to know of it."""

    def __init__(self, guard: Guard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.requests = 0  # requests started on it
        self.in_progress = 0

    @property
    def busy(self) -> bool:
        return self.in_progress > 0

    def started(self) -> None:
        self.requests += 1
        self.in_progress += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            # An abort, not a close: nothing is owed to the client, and the descriptor is
            # given back at once, not after a lingering close.
            self._transport.abort()  # type: ignore[attr-defined]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._guard.header_timeout, self._guard.headers_due, self)
        self._guard.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._guard.lost(self)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class AcceptErrors:
    """An event loop exception handler that logs a listening socket's resource errors (EMFILE
    and the like, which can come thousands of times a second) throttled, and passes anything
    else to the handler it replaces."""

    def __init__(
        self,
        log: Throttled,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
    ) -> None:
        self._log = log
        self._previous = previous

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS:
            name = errno.errorcode.get(exc.errno, str(exc.errno))
            self._log(
                f"cannot accept connections: {exc.strerror} ({name}); idle connections are "
                "closed as they time out"
            )
        elif self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    @classmethod
    def install(cls, log: Throttled) -> AcceptErrors:
        loop = asyncio.get_running_loop()
        handler = cls(log, loop.get_exception_handler())
        loop.set_exception_handler(handler)
        return handler


class GuardedSite(web.BaseSite):
    """A TCP site whose connections go through ``guard``."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guard: Guard) -> None:
        super().__init__(runner)
        self._host, self._port, self._guard = host, port, guard

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard, self._host, self._port, backlog=self._backlog
        )
