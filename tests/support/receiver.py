"""A real webhook receiver on 127.0.0.1: records every request and answers as scripted."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``hold`` blocks the answer until the event is set."""

    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hold: asyncio.Event | None = None


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    peer: tuple[str, int] | None = None  # the client's address: one per TCP connection

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    """Start with ``await Receiver().start()``; point endpoints at ``receiver.url(path)``."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.requests: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        # Per path: requests in flight now, and how many were in flight as each one arrived.
        self.in_flight_to: dict[str, int] = defaultdict(int)
        self.in_flight_at_arrival: dict[str, list[int]] = defaultdict(list)
        self._scripts: dict[str, deque[Reply]] = defaultdict(deque)
        self._defaults: dict[str, Reply] = {}
        self._runner: web.AppRunner | None = None
        # Decides the answer from the request itself, when set (scripts still come first).
        self.responder: Callable[[Received], Reply] | None = None
        self.port = 0

    async def start(self) -> Receiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str = "/hook") -> str:
        scheme = "https" if self.ssl_context else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply, then: Reply | None = None) -> None:
        """Answer requests to ``path`` with ``replies`` in order, then ``then`` (default 200)."""
        self._scripts[path].extend(replies)
        if then is not None:
            self._defaults[path] = then

    def to(self, path: str) -> list[Received]:
        return [r for r in self.requests if r.path == path]

    async def wait_for(self, count: int, *, path: str | None = None, timeout: float = 15) -> None:
        """Poll until ``count`` requests (to ``path``) arrived; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.to(path) if path else self.requests) < count:
            if time.monotonic() > deadline:
                got = len(self.to(path) if path else self.requests)
                raise AssertionError(f"receiver got {got} requests, expected {count}")
            await asyncio.sleep(0.02)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Received(
                request.method,
                request.path,
                _lower(request.headers),
                body,
                time.monotonic(),
                request.transport.get_extra_info("peername") if request.transport else None,
            )
        )
        path = request.path
        self.in_flight_at_arrival[path].append(self.in_flight_to[path])
        self.in_flight_to[path] += 1
        try:
            return await self._answer(request)
        finally:
            self.in_flight_to[path] -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        script = self._scripts[request.path]
        if script:
            reply = script.popleft()
        elif self.responder is not None:
            reply = self.responder(self.requests[-1])
        else:
            reply = self._defaults.get(request.path, Reply())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if reply.hold is not None:
                await reply.hold.wait()
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            self.in_flight -= 1
        return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


def _lower(headers: Any) -> dict[str, str]:
    return {key.lower(): value for key, value in headers.items()}
