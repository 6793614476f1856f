"""The benchmark receiver's timed requests (``/timed/<ms>``), which the latency section joins to
the producers' commit times by webhook id."""

from __future__ import annotations

import asyncio
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


async def read(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.json()


async def test_a_timed_request_keeps_its_id_its_arrival_and_its_answer(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        for webhook_id, path in (("now", "/timed/0"), ("later", "/timed/30")):
            async with session.post(
                base + path, data=b"not parsed", headers={"webhook-id": webhook_id}
            ) as response:
                assert response.status == 204
        found = await read(session, f"{base}/_timed")
        progress = await read(session, f"{base}/_progress")
    assert found["ids"] == ["now", "later"]
    arrived, answered = found["arrived"], found["answered"]
    assert isinstance(arrived, list)
    assert isinstance(answered, list)
    assert answered[0] == arrived[0]  # answered at once
    assert answered[1] > arrived[1]  # answered after its delay
    assert progress == {"requests": 2}


async def test_a_timed_request_whose_client_left_has_no_answer(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(
            session.post(f"{base}/timed/5000", data=b"{}", headers={"webhook-id": "gone"})
        )
        async with aiohttp.ClientSession() as other:
            while not (await read(other, f"{base}/_progress"))["requests"]:
                await asyncio.sleep(0.01)
        request.cancel()
    async with aiohttp.ClientSession() as session:
        found = await read(session, f"{base}/_timed")
    assert found["ids"] == ["gone"]
    assert found["answered"] == [0.0]


async def test_a_reset_forgets_the_timed_requests(base: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/timed/0", data=b"{}", headers={"webhook-id": "x"}):
            pass
        async with session.post(f"{base}/_reset"):
            pass
        found = await read(session, f"{base}/_timed")
    assert found == {"ids": [], "arrived": [], "answered": []}
