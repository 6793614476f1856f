"""The function-key check of ``outbox serve``'s HTTP routes, against raw requests."""

from __future__ import annotations

import asyncio

import azure.functions as func
import pytest
from aiohttp import test_utils

from outbox.serve import Binding, http_app

KEY = "serve-unit-function-key-0123456789"


async def ok(request: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("{}", status_code=200, mimetype="application/json")


async def raw_status(server: test_utils.TestServer, header: bytes) -> int:
    """The status of ``POST /api/outbox/drain`` sent with ``header``, bytes exactly as given."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /api/outbox/drain HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        + header
        + b"\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (b"x-functions-key: \xff\xfe", 401),
        (b"x-functions-key: caf\xc3\xa9-not-the-key", 401),
        (b"x-functions-key: " + KEY.encode(), 200),
    ],
)
async def test_a_function_key_header_of_any_bytes_is_checked_not_crashed_on(
    header: bytes, status: int
) -> None:
    binding = Binding("drain", {"route": "outbox/drain", "methods": ["POST"]}, ok)
    async with test_utils.TestServer(http_app([binding], KEY)) as server:
        assert await raw_status(server, header) == status
