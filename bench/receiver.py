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

Control endpoints (for the benchmark driver only):
``GET /_stats`` → ``{"requests", "distinct", "first", "last", "latencies", "max_in_flight",
"refused", "connections"}`` (``connections``: distinct connections the counted requests came
in on); ``POST /_reset``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import time

from aiohttp import web

MAX_BODY_BYTES = 2 * 1_048_576  # the largest payload allowed, in its envelope
LOGNORMAL_SIGMA = 0.5
# The limited receiver's own answer time, milliseconds.
LIMITED_MS = 100


class Recorder:
    """What arrived since the last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ids: list[str] = []
        self.first = 0.0
        self.last = 0.0
        self.latencies: list[float] = []
        self.in_flight = 0  # the limited receiver's
        self.max_in_flight = 0
        self.refused = 0
        self.peers: set[object] = set()  # the connections requests came in on

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        if request.path.startswith("/limited/"):
            return await self._limited(request, int(request.path.rsplit("/", 1)[1]))
        delay = _delay(request.path)
        if delay:
            await asyncio.sleep(delay)
        self._arrived(request)
        return web.Response(status=204)

    def _arrived(self, request: web.Request) -> None:
        now = time.time()
        if not self.ids:
            self.first = now
        self.last = now
        self.ids.append(request.headers.get("webhook-id", ""))
        self.peers.add(request.transport and request.transport.get_extra_info("peername"))

    async def _limited(self, request: web.Request, limit: int) -> web.Response:
        if self.in_flight >= limit:
            self.refused += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(LIMITED_MS / 1000)
        finally:
            self.in_flight -= 1
        self._arrived(request)
        return web.Response(status=204)

    async def latency(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        self.latencies.append(now - float(json.loads(body)["data"]["committedAt"]))
        self.ids.append(request.headers.get("webhook-id", ""))
        self.last = now
        return web.Response(status=204)

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response(
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

    async def clear(self, _: web.Request) -> web.Response:
        self.reset()
        return web.Response(status=204)


def _delay(path: str) -> float:
    """Seconds to wait before answering a request to ``path``."""
    if path.startswith("/slow/"):
        return int(path.rsplit("/", 1)[1]) / 1000
    if path.startswith("/lognormal/"):
        median = int(path.rsplit("/", 1)[1]) / 1000
        return random.lognormvariate(math.log(median), LOGNORMAL_SIGMA)
    return 0.0


def make_app() -> web.Application:
    recorder = Recorder()
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/_stats", recorder.stats)
    app.router.add_post("/_reset", recorder.clear)
    app.router.add_post("/latency", recorder.latency)
    app.router.add_post("/{tail:.*}", recorder.hook)
    return app


async def serve(port: int) -> None:
    runner = web.AppRunner(make_app(), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    print(f"listening {runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
