"""The wake-up channel over PostgreSQL (OUTBOX_WAKEUP=postgres), besides the NOTIFY itself (a
relay's ``PostgresStore.notify_wakeup``, a producer's ``caller.wakeup_statement``): a connection of
its own LISTENing for it, and how full the server's NOTIFY queue is.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from outbox.core.settings import WAKEUP_CHANNEL
from outbox.store.connection import COMMAND_TIMEOUT_SECONDS, Connection, database_boundary
from outbox.store.sql import QUERIES


@database_boundary
async def listen_for_wakeups(
    url: str, on_wakeup: Callable[[], None], on_lost: Callable[[], None]
) -> Connection:
    """A connection of its own LISTENing on the wake-up channel: ``on_wakeup`` at each
    notification, ``on_lost`` when the connection ends. Close it when done."""
    conn = await asyncpg.connect(url, command_timeout=COMMAND_TIMEOUT_SECONDS)
    try:
        conn.add_termination_listener(lambda _conn: on_lost())
        await conn.add_listener(WAKEUP_CHANNEL, lambda *_: on_wakeup())
    except BaseException:
        conn.terminate()
        raise
    return conn


@database_boundary
async def notify_queue_usage(conn: Connection) -> float:
    """The fraction of the server's NOTIFY queue in use, 0 to 1 (pg_notification_queue_usage)."""
    usage: float = await conn.fetchval(QUERIES["notify_queue_usage"])
    return usage
