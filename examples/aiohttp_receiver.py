"""A receiver of the relay's webhooks as an aiohttp service over SQLAlchemy's AsyncSession.

    pip install "outbox-relay[sqlalchemy,psycopg]"
    export OUTBOX_DATABASE_URL=postgresql://… ORDERS_WEBHOOK_SECRET=whsec_…
    python -m examples.aiohttp_receiver

It listens on 127.0.0.1:8080 for ``POST /webhooks/orders``. The database is the receiving
service's own, with ``outbox_inbox`` (``python -m outbox migrate --inbox``) and the table of
``shipments.sql``. A request that fails verification is answered 401; otherwise the claim and the
shipment are one transaction, and a duplicate writes nothing and is answered 204 all the same.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from aiohttp import web
from sqlalchemy import BigInteger, Text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import inbox

SESSIONS = web.AppKey("sessions", async_sessionmaker[AsyncSession])
SECRET = web.AppKey("secret", str)


class Base(DeclarativeBase):
    pass


class Shipment(Base):
    __tablename__ = "shipments"

    shipment_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    order_id: Mapped[int] = mapped_column(BigInteger)
    webhook_id: Mapped[str] = mapped_column(Text)


async def receive(request: web.Request) -> web.Response:
    """One signed event from the relay; 204 once it is applied (or was, before)."""
    try:
        event = inbox.verify(await request.read(), request.headers, request.app[SECRET])
    except inbox.InvalidSignature as exc:
        return web.Response(status=401, text=f"invalid webhook: {exc}")
    async with request.app[SESSIONS]() as session, session.begin():
        if await inbox.claim(session, event.id) and event.type == "OrderCompleted":
            session.add(Shipment(order_id=int(event.data["orderId"]), webhook_id=event.id))
    return web.Response(status=204)


def make_app(database_url: str, secret: str) -> web.Application:
    """The service: ``database_url`` as the relay's settings write it (``postgresql://``)."""
    app = web.Application()
    app[SECRET] = secret
    app.router.add_post("/webhooks/orders", receive)

    async def engine(app: web.Application) -> AsyncIterator[None]:
        url = make_url(database_url).set(drivername="postgresql+psycopg")
        made = create_async_engine(url, pool_size=4)
        app[SESSIONS] = async_sessionmaker(made, expire_on_commit=False)
        yield
        await made.dispose()

    app.cleanup_ctx.append(engine)
    return app


def main() -> None:
    app = make_app(os.environ["OUTBOX_DATABASE_URL"], os.environ["ORDERS_WEBHOOK_SECRET"])
    web.run_app(app, host="127.0.0.1", port=8080)


if __name__ == "__main__":
    main()
