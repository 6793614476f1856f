"""A TCP proxy in the test's event loop, to take a service away from the relay and give it back.

``down()`` cuts every open connection and answers each new one by closing it at once (the
client sees a reset, as when a database host is lost); ``up()`` forwards again.
``hold_closes()`` forwards everything the server sends but keeps the client's side of a connection
open after the server closed it, until ``release_closes()``: the client has read the server's last
words and has not yet seen the end of the stream, a window that is otherwise a few microseconds.
``hold_answers()`` keeps what the server sends until ``release_answers()``; ``requests`` counts
what clients sent that starts as an HTTP request does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

HTTP_METHODS = {b"GET", b"POST", b"PUT", b"DELETE", b"HEAD"}


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.refused = 0  # connections turned away while down
        self.closed_by_server = 0
        self._up = True
        self._closes = asyncio.Event()
        self._closes.set()
        self._answers = asyncio.Event()
        self._answers.set()
        self.requests = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.down()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def down(self) -> None:
        self._up = False
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    def up(self) -> None:
        self._up = True

    def hold_closes(self) -> None:
        self._closes.clear()

    def release_closes(self) -> None:
        self._closes.set()

    def hold_answers(self) -> None:
        self._answers.clear()

    def release_answers(self) -> None:
        self._answers.set()

    def _sent(self, data: bytes) -> None:
        if data.split(b" ", 1)[0] in HTTP_METHODS:
            self.requests += 1

    async def _server_closed(self) -> None:
        self.closed_by_server += 1
        await self._closes.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._up:
            self.refused += 1
            _abort(writer)
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(writer)
            return
        self._writers.update({writer, upstream_writer})
        await asyncio.gather(
            _pipe(reader, upstream_writer, seen=self._sent),
            _pipe(upstream_reader, writer, before_close=self._server_closed, gate=self._answers),
            return_exceptions=True,
        )
        for end in (writer, upstream_writer):
            self._writers.discard(end)
            _abort(end)


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    before_close: Callable[[], Awaitable[None]] | None = None,
    seen: Callable[[bytes], None] | None = None,
    gate: asyncio.Event | None = None,
) -> None:
    try:
        while data := await reader.read(65536):
            if seen is not None:
                seen(data)
            if gate is not None:
                await gate.wait()
            writer.write(data)
            await writer.drain()
        if before_close is not None:
            await before_close()
    finally:
        _abort(writer)


def _abort(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.transport.abort()
