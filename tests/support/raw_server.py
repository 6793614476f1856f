"""A TCP server that speaks whatever bytes a test scripts: broken HTTP, slow HTTP, endless HTTP.

The aiohttp receiver always answers well-formed HTTP; hostile receivers need a raw socket.
Each answer is a coroutine ``answer(writer, server)`` run after the request has been read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Self

Answer = Callable[[asyncio.StreamWriter, "RawServer"], Awaitable[None]]


class _TcpServer:
    """A server on a free port of 127.0.0.1 whose connection handlers stop with it."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


class RawServer(_TcpServer):
    def __init__(self, answer: Answer) -> None:
        super().__init__()
        self.answer = answer
        self.requests = 0  # complete requests read
        self.bytes_sent = 0  # answer bytes the client accepted (written and drained)
        self.closed_by_client = 0  # answers cut short because the client went away

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write and wait until the client has taken the bytes (raises once it has gone)."""
        writer.write(data)
        await writer.drain()
        self.bytes_sent += len(data)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = _content_length(head)
            await reader.readexactly(length)
            self.requests += 1
            await self.answer(writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client += 1
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.transport.abort()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def bytes_answer(data: bytes) -> Answer:
    """Send ``data`` and close."""

    async def answer(writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.send(writer, data)

    return answer


def trickle_answer(head: bytes, byte: bytes, interval: float) -> Answer:
    """Send ``head``, then one ``byte`` every ``interval`` seconds until the client gives up."""

    async def answer(writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.send(writer, head)
        while True:
            await asyncio.sleep(interval)
            await server.send(writer, byte)

    return answer


def endless_body_answer(status: int, total_bytes: int, chunk: bytes = b"x" * 65536) -> Answer:
    """A response that announces ``total_bytes`` of body and sends it as fast as it is taken."""

    async def answer(writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.send(
            writer,
            f"HTTP/1.1 {status} Whatever\r\ncontent-type: text/plain\r\n"
            f"content-length: {total_bytes}\r\n\r\n".encode(),
        )
        left = total_bytes
        while left > 0:
            piece = chunk[: min(left, len(chunk))]
            await server.send(writer, piece)
            left -= len(piece)

    return answer


STRAY_RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class StrayServer(_TcpServer):
    """A keep-alive HTTP/1.1 server that, after some answers, sends a second response nobody
    asked for: ``HTTP/1.1 200`` on the same connection, ``delay`` seconds after the real one.

    ``answers[path]`` is the status each request to ``path`` gets (the last one repeats);
    ``stray[path]`` the delay of the unsolicited 200 that follows each answer there.
    """

    def __init__(self, answers: dict[str, list[int]], stray: dict[str, float]) -> None:
        super().__init__()
        self.answers = answers
        self.stray = stray
        self.requests: list[str] = []  # the path of each request, in order
        self.strays_sent = 0

    def _status(self, path: str) -> int:
        seen = self.requests.count(path)
        statuses = self.answers[path]
        return statuses[min(seen, len(statuses)) - 1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(_content_length(head))
                path = head.split(b" ", 2)[1].decode()
                self.requests.append(path)
                status = self._status(path)
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
                if path in self.stray:
                    stray = asyncio.create_task(self._stray(writer, self.stray[path]))
                    self._tasks.add(stray)
                    stray.add_done_callback(self._tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)

    async def _stray(self, writer: asyncio.StreamWriter, delay: float) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            if delay:
                await asyncio.sleep(delay)
            if not writer.is_closing():
                writer.write(STRAY_RESPONSE)
                await writer.drain()
                self.strays_sent += 1
