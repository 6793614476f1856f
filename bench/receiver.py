"""The webhook receiver every contender posts to, run as its own process.

    python -m bench.receiver [--port 0]

Prints ``listening <port>`` once it accepts connections, then answers ``204`` to every POST and
remembers each request's ``webhook-id`` and arrival time. Requests to ``/latency`` carry the
producer's commit time in the body (``data.committedAt``, unix seconds) and are turned into a
latency at arrival; no other body is parsed, so the receiver costs every contender the same.

Slow receivers (the latency-bound section, ``bench.slow``): a POST to ``/slow/<ms>`` is answered
after ``<ms>`` milliseconds; to ``/lognormal/<ms>`` after a lognormal delay whose median is
``<ms>`` (sigma ``LOGNORMAL_SIGMA``: one request in a hundred takes over 3.2 times the median).
A POST to ``/limited/<n>`` is answered 429 with ``Retry-After: 1`` when ``n`` requests to it are
already in flight (a receiver that pushes back above what it can take).

Timed requests (the latency section, ``bench.latency``): a POST to ``/timed/<ms>`` is answered
after ``<ms>`` milliseconds (0: at once), and its ``webhook-id``, its arrival and its answer are
kept (unix seconds, this machine's clock), without reading its body: the producer keeps each
message's commit time beside, and the two are joined by id afterwards.

A delayed request whose connection is lost before its answer is not counted, and a limited
one frees its place at once. What the server cannot read gets 400 (413 above
``MAX_BODY_BYTES``), a request it cannot answer (``/slow/x``) 500, each with the connection
closed after; nothing a client sends makes it spin or buffer without bound.

Control endpoints (for the benchmark driver only):
``GET /_stats`` → ``{"requests", "distinct", "first", "last", "latencies", "max_in_flight",
"refused", "connections"}`` (``connections``: distinct connections the counted requests came
in on); ``GET /_progress`` → ``{"requests"}`` (cheap enough to poll during a timed run);
``GET /_timed`` → ``{"ids", "arrived", "answered"}`` (one entry per timed request, in order of
arrival; ``answered`` 0 where the connection was lost first); ``POST /_reset``.

The receiver stands in for machines elsewhere, but here it shares the benchmark's cores with
the contenders and PostgreSQL: every microsecond it spends is taken from them. So it is a small
HTTP/1.1 server on asyncio's ``Protocol`` (keep-alive, ``Content-Length`` or chunked bodies, one
request at a time per connection, a delayed answer as a timer, not a task) rather than a web
framework: aiohttp's server spent about 70 µs of CPU on an instant answer and 100 to 150 µs on a
delayed one here (now about 20 and 30 to 50), which on two cores took from the relay's share.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import time

MAX_BODY_BYTES = 2 * 1_048_576  # the largest payload allowed, in its envelope
LOGNORMAL_SIGMA = 0.5
# The limited receiver's own answer time, milliseconds.
LIMITED_MS = 100
MAX_HEAD_BYTES = 64 * 1024
# What one connection may hold unread while its answer waits: then it stops reading.
MAX_BUFFERED_BYTES = MAX_HEAD_BYTES + MAX_BODY_BYTES
# A half-closed connection (after a 400/413/500) is closed this long after, at the latest.
CLOSE_AFTER_SECONDS = 1.0
DIGITS = re.compile(r"[0-9]{1,10}")
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,8}")

NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"
TOO_MANY = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
TOO_LARGE = b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class BadRequest(Exception):
    """A request this server cannot read: answered 400 (413 when too large), then closed."""

    def __init__(self, answer: bytes = BAD_REQUEST) -> None:
        super().__init__(answer)
        self.answer = answer


class Request:
    """One parsed request: what the recorder looks at."""

    __slots__ = ("body", "close", "generation", "method", "path", "timed", "webhook_id")

    def __init__(self, method: str, path: str, webhook_id: str, body: bytes, close: bool) -> None:
        self.method = method
        self.path = path
        self.webhook_id = webhook_id
        self.body = body
        self.close = close
        self.generation = -1  # the recorder's, when it counted this request in flight
        self.timed = -1  # its place in the recorder's timed lists, for a timed request


class Recorder:
    """What arrived since the last reset."""

    def __init__(self) -> None:
        self.generation = 0
        self.reset()

    def reset(self) -> None:
        self.generation += 1  # requests in flight before a reset are not counted down after
        self.ids: list[str] = []
        self.first = 0.0
        self.last = 0.0
        self.latencies: list[float] = []
        self.in_flight = 0  # the limited receiver's
        self.max_in_flight = 0
        self.refused = 0
        self.peers: set[int] = set()  # the connections requests came in on
        self.timed_ids: list[str] = []
        self.timed_arrived: list[float] = []
        self.timed_answered: list[float] = []

    def answer(self, request: Request, connection: int) -> tuple[float, bytes]:
        """(seconds to wait, response) for ``request``, which came in on ``connection``."""
        path = request.path
        if request.method != "POST":
            return 0.0, self._read(request.method, path)
        if path == "/_reset":
            self.reset()
            return 0.0, NO_CONTENT
        if path == "/latency":
            now = time.time()
            self.latencies.append(now - float(json.loads(request.body)["data"]["committedAt"]))
            self.ids.append(request.webhook_id)
            self.last = now
            return 0.0, NO_CONTENT
        if path.startswith("/limited/"):
            return self._limited(request, int(path.rsplit("/", 1)[1]))
        if path.startswith("/timed/"):
            return self._timed(request, connection, int(path.rsplit("/", 1)[1]))
        delay = _delay(path)
        if not delay:
            self.arrived(request, connection)
        return delay, NO_CONTENT

    def _limited(self, request: Request, limit: int) -> tuple[float, bytes]:
        if self.in_flight >= limit:
            self.refused += 1
            return 0.0, TOO_MANY
        request.generation = self.generation
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return LIMITED_MS / 1000, NO_CONTENT

    def _timed(self, request: Request, connection: int, ms: int) -> tuple[float, bytes]:
        if ms < 0:
            raise ValueError(ms)
        self.arrived(request, connection)
        request.timed = len(self.timed_ids)
        self.timed_ids.append(request.webhook_id)
        self.timed_arrived.append(self.last)
        self.timed_answered.append(0.0 if ms else self.last)
        return ms / 1000, NO_CONTENT

    def answered(self, request: Request) -> None:
        """A timed request's delayed answer is being sent: its time is kept (unless the lists
        were reset meanwhile)."""
        at = request.timed
        if at < len(self.timed_ids) and self.timed_ids[at] == request.webhook_id:
            self.timed_answered[at] = time.time()

    def abandoned(self, request: Request) -> None:
        """A delayed request is answered or its connection lost: no longer in flight."""
        if request.generation == self.generation:
            request.generation = -1
            self.in_flight -= 1

    def arrived(self, request: Request, connection: int) -> None:
        now = time.time()
        if not self.ids:
            self.first = now
        self.last = now
        self.ids.append(request.webhook_id)
        self.peers.add(connection)

    def _read(self, method: str, path: str) -> bytes:
        """The answer to a GET of a control endpoint."""
        if method != "GET":
            return NOT_FOUND
        if path == "/_stats":
            return self._stats()
        if path == "/_progress":
            return _json({"requests": len(self.ids)})
        if path == "/_timed":
            timed = {
                "ids": self.timed_ids,
                "arrived": self.timed_arrived,
                "answered": self.timed_answered,
            }
            return _json(timed)
        return NOT_FOUND

    def _stats(self) -> bytes:
        return _json(
            {
                "requests": len(self.ids),
                "distinct": len(set(self.ids) - {""}),
                "first": self.first,
                "last": self.last,
                "latencies": self.latencies,
                "max_in_flight": self.max_in_flight,
                "refused": self.refused,
                "connections": len(self.peers),
            }
        )


def _json(value: object) -> bytes:
    """A 200 answer with ``value`` as its JSON body."""
    body = json.dumps(value).encode()
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _delay(path: str) -> float:
    """Seconds to wait before answering a request to ``path``."""
    if path.startswith("/slow/"):
        return int(path.rsplit("/", 1)[1]) / 1000
    if path.startswith("/lognormal/"):
        median = int(path.rsplit("/", 1)[1]) / 1000
        return random.lognormvariate(math.log(median), LOGNORMAL_SIGMA)
    return 0.0


def parse(buffer: bytearray) -> tuple[Request, int] | None:
    """The first whole request in ``buffer`` and how many bytes it took, or None for more."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise BadRequest
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest from None
    length, chunked, webhook_id, close = _headers(lines[1:], close=version != "HTTP/1.1")
    start = end + 4
    if chunked:
        read = _chunked(buffer, start)
        if read is None:
            return None
        body, stop = read
    else:
        if length > MAX_BODY_BYTES:
            raise BadRequest(TOO_LARGE)
        stop = start + length
        if len(buffer) < stop:
            return None
        body = bytes(buffer[start:stop])
    path = target.split("?", 1)[0]
    return Request(method, path, webhook_id, body, close), stop


def _headers(lines: list[str], *, close: bool) -> tuple[int, bool, str, bool]:
    """(content length, whether chunked, webhook-id, whether to close after) of header lines."""
    length = 0
    chunked = False
    webhook_id = ""
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            if not DIGITS.fullmatch(value.strip()):
                raise BadRequest
            length = int(value)
        elif name == "transfer-encoding":
            chunked = value.strip().lower() == "chunked"
        elif name == "webhook-id":
            webhook_id = value.strip()
        elif name == "connection":
            close = value.strip().lower() == "close"
    return length, chunked, webhook_id, close


def _chunked(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    """A chunked body from ``at`` and where it ends, or None while it is incomplete."""
    parts: list[bytes] = []
    size = 0
    while True:
        line = _chunk_size(buffer, at)
        if line is None:
            return None
        chunk, at = line
        size += chunk
        if size > MAX_BODY_BYTES:
            raise BadRequest(TOO_LARGE)
        if chunk == 0:
            trailer_end = buffer.find(b"\r\n\r\n", at - 2)
            if trailer_end < 0:
                if len(buffer) - at > MAX_HEAD_BYTES:
                    raise BadRequest
                return None
            return b"".join(parts), trailer_end + 4
        if len(buffer) < at + chunk + 2:
            return None
        if buffer[at + chunk : at + chunk + 2] != b"\r\n":
            raise BadRequest
        parts.append(bytes(buffer[at : at + chunk]))
        at += chunk + 2


def _chunk_size(buffer: bytearray, at: int) -> tuple[int, int] | None:
    """The size on the chunk-size line at ``at`` (extensions ignored) and where its data
    starts, or None while the line is incomplete."""
    line_end = buffer.find(b"\r\n", at)
    if line_end < 0:
        if len(buffer) - at > MAX_HEAD_BYTES:
            raise BadRequest
        return None
    token = bytes(buffer[at:line_end]).split(b";", 1)[0].strip()
    if not CHUNK_SIZE.fullmatch(token):
        raise BadRequest
    return int(token, 16), line_end + 2


class Connection(asyncio.Protocol):
    """One client connection: requests answered in order, one at a time."""

    def __init__(self, recorder: Recorder, ids: list[int]) -> None:
        self.recorder = recorder
        ids[0] += 1
        self.id = ids[0]
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiting: asyncio.TimerHandle | None = None
        self.pending: Request | None = None  # the request whose answer is waited for

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiting is not None:
            self.waiting.cancel()
            self.waiting = None
            assert self.pending is not None
            self.recorder.abandoned(self.pending)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # closing: what else it sends is not read
        self.buffer += data
        if self.waiting is None:
            self._serve()
        elif len(self.buffer) > MAX_BUFFERED_BYTES:
            self.transport.pause_reading()  # until the waiting answer is sent

    def _serve(self) -> None:
        while self.transport is not None and self.waiting is None:
            try:
                parsed = parse(self.buffer)
            except BadRequest as bad:
                self._refuse(bad.answer)
                return
            if parsed is None:
                return
            request, used = parsed
            del self.buffer[:used]
            try:
                delay, response = self.recorder.answer(request, self.id)
            except (ValueError, KeyError, TypeError, OverflowError):  # /slow/x, a bad body
                self._refuse(FAILED)
                return
            if delay:
                loop = asyncio.get_running_loop()
                self.pending = request
                self.waiting = loop.call_later(delay, self._later, request, response)
                return
            self._send(request, response)

    def _later(self, request: Request, response: bytes) -> None:
        self.waiting = self.pending = None
        self.recorder.abandoned(request)
        if request.timed >= 0:
            self.recorder.answered(request)
        else:
            self.recorder.arrived(request, self.id)
        self._send(request, response)
        if self.transport is not None:
            self.transport.resume_reading()
            self._serve()

    def _send(self, request: Request, response: bytes) -> None:
        assert self.transport is not None
        self.transport.write(response)
        if request.close:
            self.transport.close()
            self._closing()

    def _refuse(self, answer: bytes) -> None:
        """Answer ``answer`` and close: half-closed first, so that a client still sending its
        body reads the answer rather than a reset; closed for good once it closes, or after
        ``CLOSE_AFTER_SECONDS``."""
        transport = self.transport
        assert transport is not None
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(CLOSE_AFTER_SECONDS, transport.close)
        else:
            transport.close()
        self._closing()

    def _closing(self) -> None:
        """Nothing more is read or answered on this connection."""
        self.transport = None
        self.buffer.clear()


async def start(port: int = 0) -> asyncio.Server:
    """The receiver, accepting connections on 127.0.0.1:``port`` (0: a free one)."""
    recorder = Recorder()
    ids = [0]
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: Connection(recorder, ids), "127.0.0.1", port, backlog=1024
    )


async def serve(port: int) -> None:
    server = await start(port)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
