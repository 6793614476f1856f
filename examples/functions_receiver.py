"""A receiver of the relay's webhooks as an Azure Functions HTTP trigger (a Blueprint).

    import azure.functions as func
    from examples.functions_receiver import bp

    app = func.FunctionApp()
    app.register_functions(bp)

App settings: ``OUTBOX_DATABASE_URL``, the receiving service's own database (with ``outbox_inbox``
from ``python -m outbox migrate --inbox`` and the table of ``shipments.sql``), and
``ORDERS_WEBHOOK_SECRET``, the ``whsec_…`` secret of the relay's endpoint for ``OrderCompleted``
(two, space-separated, while it is rotated). Point that endpoint at ``/api/webhooks/orders``.

A request that fails verification is answered 401. Otherwise its id is claimed and the shipment
written in one transaction; a duplicate (the relay delivers at least once) writes nothing and is
answered 204 all the same, so the relay stops sending it.
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg
import azure.functions as func

from outbox import inbox

bp = func.Blueprint()  # type: ignore[no-untyped-call]
# One pool per worker process and database, made at the first request: never at import, which
# happens while the host indexes the app.
_pools: dict[str, Any] = {}


async def database() -> Any:
    """The worker's pool for ``OUTBOX_DATABASE_URL``."""
    url = os.environ["OUTBOX_DATABASE_URL"]
    if url not in _pools:
        pool = await asyncpg.create_pool(url, min_size=0, max_size=4)
        if _pools.setdefault(url, pool) is not pool:  # another request made one meanwhile
            await pool.close()
    return _pools[url]


async def close_pools() -> None:
    """Close the worker's pools (at shutdown; the tests, between two of them)."""
    while _pools:
        await _pools.popitem()[1].close()


@bp.function_name(name="orders_webhook")
@bp.route(route="webhooks/orders", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS)
async def orders_webhook(req: func.HttpRequest) -> func.HttpResponse:
    """POST /api/webhooks/orders: one signed event from the relay; 204 once it is applied."""
    try:
        event = inbox.verify(req.get_body(), req.headers, os.environ["ORDERS_WEBHOOK_SECRET"])
    except inbox.InvalidSignature as exc:
        return func.HttpResponse(f"invalid webhook: {exc}", status_code=401)
    pool = await database()
    async with pool.acquire() as conn, conn.transaction():
        if await inbox.claim(conn, event.id):
            await ship(conn, event)
    return func.HttpResponse(status_code=204)


async def ship(conn: Any, event: inbox.WebhookEvent) -> None:
    """The business write, in the transaction of the claim."""
    if event.type == "OrderCompleted":
        await conn.execute(
            "INSERT INTO shipments (order_id, webhook_id) VALUES ($1, $2)",
            int(event.data["orderId"]),
            event.id,
        )
