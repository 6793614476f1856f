"""The benchmark's receiver: a small HTTP/1.1 server every contender posts to (bench.receiver).

Driven by aiohttp's client, as the contenders drive it, and by a raw socket where the client
would not send what is tested (pipelined requests, a request it cannot read)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from bench import receiver


@pytest.fixture
async def base() -> AsyncIterator[str]:
    server = await receiver.start()
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}"


async def stats(session: aiohttp.ClientSession, base: str) -> dict[str, object]:
    async with session.get(f"{base}/_stats") as response:
        assert response.status == 200
        return await response.json()


async def test_counts_each_request_on_one_kept_alive_connection(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        for n in range(3):
            async with session.post(
                f"{base}/hook", data=b'{"x": 1}', headers={"webhook-id": f"msg_{n}"}
            ) as response:
                assert response.status == 204
        async with session.post(f"{base}/hook", data=b"{}", headers={"webhook-id": "msg_0"}):
            pass
        seen = await stats(session, base)
    assert seen["requests"] == 4
    assert seen["distinct"] == 3
    assert seen["connections"] == 1
    assert 0 < seen["first"] <= seen["last"]


async def test_a_slow_path_answers_after_its_delay_and_counts_then(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        request = asyncio.ensure_future(session.post(f"{base}/slow/200", data=b"{}"))
        await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as other:
            assert (await stats(other, base))["requests"] == 0  # not answered yet
        async with await request as response:
            assert response.status == 204
        assert time.monotonic() - started >= 0.2
        assert (await stats(session, base))["requests"] == 1


async def test_the_lognormal_path_answers(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/lognormal/5", data=b"{}") as response:
            assert response.status == 204
        assert (await stats(session, base))["requests"] == 1


async def test_the_limited_path_refuses_above_its_limit_with_retry_after(base: str) -> None:
    async def post(session: aiohttp.ClientSession) -> tuple[int, str | None]:
        async with session.post(f"{base}/limited/2", data=b"{}") as response:
            return response.status, response.headers.get("Retry-After")

    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(post(session) for _ in range(5)))
        seen = await stats(session, base)
    assert sorted(answers, key=str) == [(204, None)] * 2 + [(429, "1")] * 3
    assert seen["max_in_flight"] == 2
    assert seen["refused"] == 3
    assert seen["requests"] == 2


async def test_a_connection_lost_while_limited_frees_its_place_once(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /limited/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.02)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.02)
    async with aiohttp.ClientSession() as session:

        async def post() -> int:
            async with session.post(f"{base}/limited/1", data=b"{}") as response:
                return response.status

        # Freed once, not twice: of two at once, one is still refused.
        assert sorted(await asyncio.gather(post(), post())) == [204, 429]
        assert (await stats(session, base))["max_in_flight"] == 1


async def raw_exchange(base: str, *parts: bytes) -> bytes:
    """Send ``parts`` on one connection, a moment apart; everything answered until it closes."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    for part in parts:
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(0.01)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_headers_split_across_reads_in_any_case_and_chunk_extensions_are_read(
    base: str,
) -> None:
    answer = await raw_exchange(
        base,
        b"POST /hook HTTP/1.1\r\nHost: x\r\nWeb",
        b"hook-Id: msg_a\r\nTRANSFER-ENCODING: chunked\r\nConnection: close\r\n\r\n",
        b"2;name=value\r\n{}\r\n0\r\nX-Trailer: y\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 204")
    async with aiohttp.ClientSession() as session:
        seen = await stats(session, base)
    assert (seen["requests"], seen["distinct"]) == (1, 1)


async def test_a_bad_chunk_size_gets_400_and_the_receiver_goes_on(base: str) -> None:
    head = b"POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    for body in (b"-6\r\n", b"0x2\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n"):
        assert (await raw_exchange(base, head + body)).startswith(b"HTTP/1.1 400")
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/hook", data=b"{}") as response:
            assert response.status == 204


async def test_a_request_it_cannot_answer_gets_500_and_is_closed(base: str) -> None:
    for path in (b"/slow/x", b"/lognormal/0", b"/latency"):
        request = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        assert (await raw_exchange(base, request)).startswith(b"HTTP/1.1 500")


async def test_nothing_after_a_request_that_closes_is_read(base: str) -> None:
    closing = b"POST /hook HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    after = b"POST /hook HTTP/1.1\r\nHost: x\r\nwebhook-id: b\r\nContent-Length: 0\r\n\r\n"
    answer = await raw_exchange(base, closing + after)
    assert answer.count(b"HTTP/1.1") == 1
    async with aiohttp.ClientSession() as session:
        assert (await stats(session, base))["requests"] == 1


async def test_chunked_bodies_and_latency_bodies_are_read(base: str) -> None:
    body = json.dumps({"data": {"committedAt": time.time() - 0.5}}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield body[:10]
        yield body[10:]

    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/latency", data=chunks()) as response:
            assert response.status == 204
        async with session.post(f"{base}/latency", data=body) as response:
            assert response.status == 204
        seen = await stats(session, base)
    assert len(seen["latencies"]) == 2
    assert all(0.4 < latency < 60 for latency in seen["latencies"])


async def test_a_body_above_the_largest_payload_is_refused_413(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        big = b"x" * (receiver.MAX_BODY_BYTES + 1)
        async with session.post(f"{base}/hook", data=big) as response:
            assert response.status == 413
        large = b"x" * receiver.MAX_BODY_BYTES
        async with session.post(f"{base}/hook", data=large) as response:
            assert response.status == 204


async def test_pipelined_requests_are_answered_in_order(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    one = b"POST /slow/50 HTTP/1.1\r\nHost: x\r\nwebhook-id: a\r\nContent-Length: 2\r\n\r\n{}"
    two = b"GET /_stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    writer.write(one + two)
    answer = await reader.read()
    writer.close()
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 204")
    assert rest.startswith(b"HTTP/1.1 200")
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["requests"] == 1  # counted before


async def test_a_request_it_cannot_read_gets_400_and_is_closed(base: str) -> None:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"NONSENSE\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 400")


async def test_reset_forgets_what_arrived(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/hook", data=b"{}"):
            pass
        async with session.post(f"{base}/_reset") as response:
            assert response.status == 204
        seen = await stats(session, base)
    assert seen["requests"] == 0
    assert seen["connections"] == 0
