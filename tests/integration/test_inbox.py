"""The consumer's inbox: claim through every driver, two consumers at once, and its retention.

Claims run once per kind of connection (tests/support/drivers.py); the concurrent ones use two
real connections of that kind, each in its own transaction, and watch the second wait on the
first's lock in pg_stat_activity.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest

from outbox import operations
from outbox.core.errors import TransactionRequiredError
from tests.integration.conftest import Connect
from tests.support.drivers import KINDS
from tests.support.outbox_helpers import eventually

ALL = sorted(KINDS)


class Rollback(Exception):
    """Raised to end a transaction by rolling it back."""


async def recorded(db: Any) -> list[str]:
    return [r["webhook_id"] for r in await db.fetch("SELECT webhook_id FROM outbox_inbox")]


async def shipped(db: Any) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM shipments")
    return count


async def waiting_on_a_lock(db: Any) -> None:
    """Until another session of this database waits for a lock (the second claim)."""

    async def waits() -> bool:
        count = await db.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool(count)

    await eventually(waits)


@pytest.mark.parametrize("kind", ALL)
async def test_an_id_is_claimed_the_first_time_only(
    kind: str, connect: Connect, inbox: Any
) -> None:
    consumer = await connect(kind)
    for _ in range(2):
        async with consumer.begin():
            if await consumer.claim("msg_1"):
                await consumer.execute("INSERT INTO shipments VALUES (1, 'msg_1')")
    assert await recorded(inbox) == ["msg_1"]
    assert await shipped(inbox) == 1
    assert await inbox.fetchval(
        "SELECT received_at > now() - interval '1 minute' FROM outbox_inbox"
    )


@pytest.mark.parametrize("kind", ALL)
async def test_a_claim_rolled_back_with_its_business_write_can_be_claimed_again(
    kind: str, connect: Connect, inbox: Any
) -> None:
    consumer = await connect(kind)
    with pytest.raises(Rollback):
        async with consumer.begin():
            assert await consumer.claim("msg_1") is True
            await consumer.execute("INSERT INTO shipments VALUES (1, 'msg_1')")
            raise Rollback
    assert (await recorded(inbox), await shipped(inbox)) == ([], 0)
    async with consumer.begin():
        assert await consumer.claim("msg_1") is True
    assert await recorded(inbox) == ["msg_1"]


@pytest.mark.parametrize("kind", ALL)
async def test_a_claim_that_would_commit_on_its_own_is_refused(
    kind: str, connect: Connect, inbox: Any
) -> None:
    consumer = await connect(kind, autocommit=True)
    with pytest.raises(TransactionRequiredError, match="claim must run inside the transaction"):
        await consumer.claim("msg_1")
    assert await recorded(inbox) == []


@pytest.mark.parametrize("kind", ALL)
async def test_what_cannot_be_a_webhook_id_is_refused_and_the_transaction_goes_on(
    kind: str, connect: Connect, inbox: Any
) -> None:
    consumer = await connect(kind)
    async with consumer.begin():
        for wrong in ("", "x" * 256, "msg\x00", "msg\n1", "msg\udcff", 42):
            with pytest.raises(ValueError, match="webhook_id must be"):
                await consumer.claim(wrong)  # type: ignore[arg-type]
        assert await consumer.claim("x" * 255) is True
    assert await recorded(inbox) == ["x" * 255]


@pytest.mark.parametrize("kind", ALL)
async def test_a_concurrent_duplicate_waits_for_the_first_and_is_skipped_once_it_commits(
    kind: str, connect: Connect, inbox: Any
) -> None:
    first, second = await connect(kind), await connect(kind)
    async with contextlib.AsyncExitStack() as later:
        await later.enter_async_context(second.begin())
        async with first.begin():
            assert await first.claim("msg_1") is True
            await first.execute("INSERT INTO shipments VALUES (1, 'msg_1')")
            duplicate = asyncio.create_task(second.claim("msg_1"))
            await waiting_on_a_lock(inbox)
            assert not duplicate.done()
        assert await duplicate is False
    assert (await recorded(inbox), await shipped(inbox)) == (["msg_1"], 1)


@pytest.mark.parametrize("kind", ALL)
async def test_a_concurrent_duplicate_waits_for_the_first_and_takes_over_if_it_rolls_back(
    kind: str, connect: Connect, inbox: Any
) -> None:
    first, second = await connect(kind), await connect(kind)
    async with contextlib.AsyncExitStack() as later:
        await later.enter_async_context(second.begin())
        with pytest.raises(Rollback):
            async with first.begin():
                assert await first.claim("msg_1") is True
                await first.execute("INSERT INTO shipments VALUES (1, 'first')")
                duplicate = asyncio.create_task(second.claim("msg_1"))
                await waiting_on_a_lock(inbox)
                assert not duplicate.done()
                raise Rollback
        assert await duplicate is True
        await second.execute("INSERT INTO shipments VALUES (1, 'second')")
    assert await recorded(inbox) == ["msg_1"]
    assert await inbox.fetchval("SELECT string_agg(webhook_id, ',') FROM shipments") == "second"


async def age(db: Any, days: float, count: int, prefix: str) -> None:
    """``count`` inbox rows received ``days`` ago."""
    await db.execute(
        "INSERT INTO outbox_inbox (webhook_id, received_at) "
        "SELECT $1 || n, now() - make_interval(secs => $2 * 86400) FROM generate_series(1, $3) n",
        prefix,
        days,
        count,
    )


async def test_purge_deletes_only_rows_older_than_asked_in_short_batches(inbox: Any) -> None:
    await age(inbox, 10, 25, "old-")
    await age(inbox, 6.9, 3, "recent-")
    report = await operations.purge_inbox(inbox, older_than_days=7, batch_size=10)
    assert report.as_dict() == {"inbox_deleted": 25, "batches": 3}
    assert sorted(await recorded(inbox)) == ["recent-1", "recent-2", "recent-3"]


async def test_purge_skips_a_row_a_consumer_holds_and_never_waits_for_it(
    inbox: Any, database_url: str
) -> None:
    await age(inbox, 30, 3, "old-")
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM outbox_inbox WHERE webhook_id = 'old-2' FOR UPDATE")
            report = await asyncio.wait_for(
                operations.purge_inbox(inbox, older_than_days=7), timeout=60
            )
    finally:
        await holder.close()
    assert report.inbox_deleted == 2
    assert await recorded(inbox) == ["old-2"]
