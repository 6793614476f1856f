"""``python -m outbox grant ROLE``: the relay runs under a role with exactly what it grants, on
both layouts: drains, reports, requeues and purges (the partitioned purge makes and drops
partitions, which needs the owner: migration 0021's functions do it for the role)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.conftest import SECRET
from tests.support import pg
from tests.support.outbox_helpers import run_cli, seed, statuses
from tests.support.receiver import Receiver, Reply


@dataclass
class Granted:
    owner_url: str  # the migrating role's (the tables' owner)
    role: str
    role_url: str  # the relay's, signing in as the granted role
    layout: str


async def _layout(url: str, layout: str) -> None:
    result = await run_cli(
        "migrate", *(["--partitioned"] if layout == "partitioned" else []), env=_env(url)
    )
    assert result.returncode == 0, result.stderr


def _env(url: str, **more: str) -> dict[str, str]:
    return {"OUTBOX_DATABASE_URL": url, **more}


@pytest.fixture(params=["plain", "partitioned"])
async def granted(request: pytest.FixtureRequest, admin_dsn: str) -> AsyncIterator[Granted]:
    name = pg.unique_name("outbox_grant")
    role = f"relay_{uuid.uuid4().hex[:10]}"
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    owner_url = pg.with_database(admin_dsn, name)
    try:
        await _layout(owner_url, request.param)
        done = await run_cli("grant", role, env=_env(owner_url))
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["created"] == "role"
        role_url = owner_url.replace("//postgres@", f"//{role}@", 1)
        assert role in role_url
        yield Granted(owner_url, role, role_url, request.param)
    finally:
        await pg.drop(admin_dsn, name)
        await pg.admin_execute(admin_dsn, f'DROP ROLE IF EXISTS "{role}"')


def webhooks(receiver: Receiver) -> str:
    return json.dumps({"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}})


async def test_grant_is_idempotent_and_names_what_it_granted(granted: Granted) -> None:
    again = await run_cli("grant", granted.role, env=_env(granted.owner_url))
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["created"] is None  # it exists: kept
    assert {"outbox_messages", "outbox_attempts", "outbox_endpoints"} <= set(report["tables"])
    assert report["read_only"] == ["outbox_migrations"]
    assert "outbox_messages_ordering_seq" in report["sequences"]
    assert report["functions"] == ["outbox_make_partition", "outbox_drop_partition"]
    assert report["default_privileges_of"] == "postgres"
    if granted.layout == "partitioned":
        assert "outbox_messages_default" in report["tables"]
        assert "outbox_message_ids" in report["tables"]


async def test_the_relay_drains_reports_and_requeues_under_the_granted_role(
    granted: Granted, receiver: Receiver
) -> None:
    owner = await asyncpg.connect(granted.owner_url)
    try:
        await seed(owner, 3)
        env = _env(granted.role_url, OUTBOX_WEBHOOKS=webhooks(receiver))
        drained = await run_cli("drain", env=env)
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["processed"] == 3
        receiver.script("/orders", Reply(410))
        await seed(owner, 1)
        assert (await run_cli("drain", env=env)).returncode == 0
        assert await statuses(owner) == {"Processed": 3, "Failed": 1}
        status = await run_cli("status", env=env)
        assert status.returncode == 0, status.stderr
        requeued = await run_cli("requeue", "--all-failed", "--yes", env=env)
        assert requeued.returncode == 0, requeued.stderr
        assert await statuses(owner) == {"Processed": 3, "Pending": 1}
        listed = await run_cli("list", "--status", "Processed", env=env)
        assert listed.returncode == 0, listed.stderr
    finally:
        await owner.close()


async def test_the_purge_runs_under_the_granted_role(granted: Granted) -> None:
    owner = await asyncpg.connect(granted.owner_url)
    try:
        old = datetime.now(UTC) - timedelta(days=30)
        if granted.layout == "partitioned":
            from outbox.store import partitions

            await partitions.ensure_partitions(owner, old, old + timedelta(days=1))
            # The furthest partition ahead is gone: the purge must make it again.
            furthest = (await partitions.partitions_of(owner, "outbox_messages"))[-2]
            await owner.execute(f"DROP TABLE {furthest.name}")
        await owner.execute(
            "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, status, "
            "created_at, processed_at) "
            "SELECT gen_random_uuid(), 'Old', '{}', 'Processed', $1, $1 FROM generate_series(1, 5)",
            old,
        )
        purged = await run_cli("purge", env=_env(granted.role_url, OUTBOX_RETENTION_DAYS="7"))
        assert purged.returncode == 0, purged.stderr
        report = json.loads(purged.stdout)
        assert await owner.fetchval("SELECT count(*) FROM outbox_messages") == 0
        if granted.layout == "partitioned":
            stamp = old.strftime("%Y%m%d")
            assert f"outbox_messages_p{stamp}" in report["partitions"]["dropped"]
            assert furthest.name in report["partitions"]["created"]  # made as the owner
            # What the purge made is the relay's to use, by the default privileges.
            role = await asyncpg.connect(granted.role_url)
            try:
                newest = report["partitions"]["created"][-1]
                assert await role.fetchval(f"SELECT count(*) FROM {newest}") == 0
            finally:
                await role.close()
    finally:
        await owner.close()


async def test_the_granted_role_uses_what_a_later_migration_adds_and_owns_nothing(
    granted: Granted,
) -> None:
    owner = await asyncpg.connect(granted.owner_url)
    role = await asyncpg.connect(granted.role_url)
    try:
        await owner.execute("CREATE TABLE outbox_later (id int)")  # a migration after the grant
        await role.execute("INSERT INTO outbox_later VALUES (1)")
        assert await role.fetchval("SELECT count(*) FROM outbox_later") == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await role.execute("DROP TABLE outbox_messages")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await role.execute("INSERT INTO outbox_migrations (name, checksum) VALUES ('x', 'y')")
        # The maintenance functions check every name: no table of anyone else's is reached.
        with pytest.raises(asyncpg.PostgresError, match="not a partitioned outbox table"):
            await role.fetchval(
                "SELECT outbox_drop_partition('outbox_migrations'::regclass, 'x', now(), "
                "NULL, NULL)"
            )
        if granted.layout == "partitioned":
            with pytest.raises(asyncpg.PostgresError, match="not a partition name"):
                await role.fetchval(
                    "SELECT outbox_drop_partition('outbox_messages'::regclass, "
                    "'outbox_migrations', now(), NULL, NULL)"
                )
    finally:
        await role.close()
        await owner.close()


async def test_without_default_privileges_a_later_table_waits_for_the_next_grant(
    admin_dsn: str,
) -> None:
    name = pg.unique_name("outbox_grant")
    role = f"relay_{uuid.uuid4().hex[:10]}"
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    url = pg.with_database(admin_dsn, name)
    try:
        await _layout(url, "plain")
        first = await run_cli("grant", role, "--no-default-privileges", env=_env(url))
        assert json.loads(first.stdout)["default_privileges_of"] is None
        owner = await asyncpg.connect(url)
        role_conn = await asyncpg.connect(url.replace("//postgres@", f"//{role}@", 1))
        try:
            await owner.execute("CREATE TABLE outbox_later (id int)")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await role_conn.execute("INSERT INTO outbox_later VALUES (1)")
            assert (await run_cli("grant", role, env=_env(url))).returncode == 0
            await role_conn.execute("INSERT INTO outbox_later VALUES (1)")
        finally:
            await role_conn.close()
            await owner.close()
    finally:
        await pg.drop(admin_dsn, name)
        await pg.admin_execute(admin_dsn, f'DROP ROLE IF EXISTS "{role}"')


async def test_grant_before_migrate_says_to_migrate_first(admin_dsn: str) -> None:
    name = pg.unique_name("outbox_grant")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        result = await run_cli("grant", "relay_x", env=_env(pg.with_database(admin_dsn, name)))
    finally:
        await pg.drop(admin_dsn, name)
    assert result.returncode == 1
    assert "run python -m outbox migrate first" in result.stderr
