"""What a container host asks ``outbox serve``: ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

- ``/healthz``: 200 ``{"status": "ok"}`` while the process serves (a liveness probe); no key.
- ``/readyz``: 200 ``{"status": "ready"}`` when the database answers and every migration the
  package carries is applied, else 503 ``{"status": "not ready"}`` (a readiness or start-up
  probe); no key, and the answer says nothing more (the reason goes to the log, at most once a
  minute).
- ``/metrics``: the relay's OpenTelemetry metrics in Prometheus' text format, through
  OpenTelemetry's Prometheus exporter (the ``prometheus`` extra); the function key is needed as
  on ``/api/`` routes (``?code=`` or ``x-functions-key``). Without the extra: 404 saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from outbox.azure import telemetry_setup
from outbox.azure.host import functions_host
from outbox.core.errors import DatabaseError
from outbox.core.logs import Throttled
from outbox.store.migrate import discover
from outbox.store.schema import applied_migrations

logger = logging.getLogger("outbox.serve")

NOT_READY_LOG_INTERVAL_SECONDS = 60.0
# Under a probe's usual timeout; a database that takes longer is not ready.
READY_TIMEOUT_SECONDS = 5.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application, key_matches: Callable[[web.Request], bool]) -> None:
    """The three routes, on ``app``; ``key_matches`` checks the function key for /metrics."""
    not_ready = Throttled(logger, NOT_READY_LOG_INTERVAL_SECONDS)

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        reason = await why_not_ready()
        if reason is None:
            return web.json_response({"status": "ready"})
        not_ready(f"/readyz: not ready: {reason}")
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics(request: web.Request) -> web.Response:
        if not key_matches(request):
            return web.json_response({"error": "a valid function key is required"}, status=401)
        exported = telemetry_setup.prometheus_text()
        if exported is None:
            error = f"metrics need the Prometheus exporter: {telemetry_setup.PROMETHEUS_EXTRA}"
            return web.json_response({"error": error}, status=404)
        body, content_type = exported
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


async def why_not_ready() -> str | None:
    """None when the database answers and its migrations are current; else why not."""
    try:
        relay = await functions_host.relay()
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            applied = await applied_migrations(relay.pool)
    except DatabaseError as exc:
        if exc.kind == "UndefinedTableError":  # not even the bookkeeping table yet
            return "no migration applied (run python -m outbox migrate)"
        return f"database error: {exc.kind}"
    except TimeoutError:
        return f"the database did not answer within {READY_TIMEOUT_SECONDS:g} s"
    missing = [m.name for m in discover() if m.name not in applied]
    if missing:
        return f"{len(missing)} migration(s) not applied (run python -m outbox migrate)"
    return None
