"""A small webhook receiver for trying the relay out: prints each event, checks its signature.

    python -m outbox.demo_receiver --port 8081 --secret whsec_...

Answers 204 to every POST. Not for production: a real receiver also drops duplicates by
``webhook-id`` and rejects old timestamps (any Standard Webhooks library does both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable

from aiohttp import web

from outbox.core.signing import verify
from outbox.hosting.terminal import help_text

MAX_BODY_BYTES = 1_048_576


def describe(body: bytes, headers: dict[str, str], secret: str | None) -> str:
    """One line per event: type, id, signature check, data."""
    try:
        event = json.loads(body)
        kind, data = event.get("type"), json.dumps(event.get("data"), ensure_ascii=False)
    except (ValueError, AttributeError, RecursionError):
        kind, data = "?", f"unreadable body ({len(body)} bytes)"
    if secret is None:
        signature = "not checked"
    else:
        try:
            signature = "valid" if verify(secret, headers, body) else "INVALID"
        except (KeyError, ValueError):
            signature = "MISSING"
    return f"received {kind} {headers.get('webhook-id', '?')} (signature {signature}): {data}"


def make_app(secret: str | None, emit: Callable[[str], None]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {key.lower(): value for key, value in request.headers.items()}
        emit(describe(body, headers, secret))
        return web.Response(status=204)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/{path:.*}", handle)
    return app


async def serve(host: str, port: int, secret: str | None) -> None:
    runner = web.AppRunner(make_app(secret, lambda line: print(line, flush=True)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"demo receiver listening on http://{host}:{port}/", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outbox.demo_receiver",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--secret", help="whsec_… secret to check signatures with")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.host, args.port, args.secret))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
