"""The relay short of its own resources: ``serve`` choked by idle connections, deliveries that
fail for want of a file descriptor. Neither is the receiver's doing: its breaker stays closed, no
attempt is spent, and delivery resumes within seconds of the shortage ending."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from outbox.breakers import THRESHOLD
from outbox.publisher import OWN_ERROR_RETRY_SECONDS
from tests.support.outbox_helpers import open_relay, seed, statuses
from tests.support.receiver import Receiver


@contextlib.contextmanager
def descriptors_exhausted() -> Iterator[None]:
    """This process can open no file descriptor (EMFILE) until the block ends.

    Every free descriptor number below the highest in use is taken, then the soft limit is set
    just above them; the descriptors already open keep working.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    try:
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
        while not fillers or fillers[-1] < highest:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        resource.setrlimit(resource.RLIMIT_NOFILE, (fillers[-1] + 1, hard))
        with pytest.raises(OSError, match="Too many open files") as refused:
            socket.socket().close()
        assert refused.value.errno == errno.EMFILE
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fillers:
            os.close(fd)


async def test_deliveries_failing_for_want_of_descriptors_spend_no_attempt_nor_open_the_breaker(
    db: Any, receiver: Receiver, make_settings: Any
) -> None:
    # More messages than the failures that open a breaker: had EMFILE counted against the
    # endpoint, its breaker would be open and every message would have spent an attempt.
    count = THRESHOLD + 5
    await seed(db, count)
    settings = make_settings(db_pool_size=4)
    async with open_relay(settings) as relay:
        # The pool's connections opened now: while descriptors are short it can open none.
        async with contextlib.AsyncExitStack() as held:
            for _ in range(settings.db_pool_size):
                await held.enter_async_context(relay.pool.acquire())
        with descriptors_exhausted():
            summary = await relay.processor.execute()
        assert receiver.requests == []
        assert (summary.processed, summary.retried, summary.failed) == (0, 0, 0)
        rows = await db.fetch(
            "SELECT status, attempt_count, last_error, "
            "extract(epoch FROM next_attempt_at - now())::float8 AS due_in FROM outbox_messages"
        )
        assert {(r["status"], r["attempt_count"], r["last_error"]) for r in rows} == {
            ("Pending", 0, None)
        }
        # Due again in seconds, not after a backoff.
        assert all(0 < r["due_in"] <= OWN_ERROR_RETRY_SECONDS for r in rows)
        opened = await db.fetchval(
            "SELECT count(*) FROM outbox_endpoints WHERE consecutive_failures > 0 OR opens > 0"
        )
        assert opened == 0
        assert await db.fetchval("SELECT count(*) FROM outbox_attempts") == 0

        # Descriptors back: the messages go at their next due time, each on its first attempt.
        await db.execute("UPDATE outbox_messages SET next_attempt_at = now()")
        summary = await relay.processor.execute()
    assert summary.processed == count
    assert len(receiver.requests) == count
    assert await statuses(db) == {"Processed": count}
    assert await db.fetchval("SELECT max(attempt_count) FROM outbox_messages") == 1
