"""``python -m outbox migrate --inbox`` and ``purge --inbox`` as a consumer's service runs them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests.support import pg
from tests.support.azure import free_port
from tests.support.outbox_helpers import run_cli

# Relay settings that would stop every relay command: a consumer's commands must not read them.
BROKEN_RELAY_SETTINGS = {
    "OUTBOX_WEBHOOKS": "not json",
    "OUTBOX_BATCH_SIZE": "-1",
    "OUTBOX_QUEUE_NAME": "Not_A_Queue",
}


@pytest.fixture
async def consumer_url(admin_dsn: str) -> AsyncIterator[str]:
    """An empty database of the consumer's own, without the relay's tables."""
    name = pg.unique_name("outbox_consumer")
    await pg.admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    yield pg.with_database(admin_dsn, name)
    await pg.drop(admin_dsn, name)


def consumer_env(url: str) -> dict[str, str]:
    return {"OUTBOX_DATABASE_URL": url, **BROKEN_RELAY_SETTINGS}


async def test_migrate_inbox_needs_only_the_database_url_and_is_safe_to_repeat(
    consumer_url: str,
) -> None:
    first = await run_cli("migrate", "--inbox", env=consumer_env(consumer_url))
    second = await run_cli("migrate", "--inbox", env=consumer_env(consumer_url))
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"applied": ["0001_create_outbox_inbox.sql"]}
    assert (second.returncode, json.loads(second.stdout)) == (0, {"applied": []})
    conn = await asyncpg.connect(consumer_url)
    try:
        assert await conn.fetchval("SELECT to_regclass('outbox_inbox') IS NOT NULL")
        assert await conn.fetchval("SELECT to_regclass('outbox_messages') IS NULL")
    finally:
        await conn.close()


async def test_purge_inbox_deletes_rows_older_than_the_days_given_and_reports_json(
    consumer_url: str,
) -> None:
    assert (await run_cli("migrate", "--inbox", env=consumer_env(consumer_url))).returncode == 0
    conn = await asyncpg.connect(consumer_url)
    try:
        await conn.execute(
            "INSERT INTO outbox_inbox (webhook_id, received_at) "
            "SELECT 'old-' || n, now() - interval '8 days' FROM generate_series(1, 2500) n "
            "UNION ALL SELECT 'new-' || n, now() - interval '6 days' FROM generate_series(1, 3) n"
        )
        done = await run_cli(
            "purge", "--inbox", "--older-than-days", "7", env=consumer_env(consumer_url)
        )
        left = await conn.fetchval(
            "SELECT count(*) FROM outbox_inbox WHERE webhook_id LIKE 'new-%'"
        )
        total = await conn.fetchval("SELECT count(*) FROM outbox_inbox")
    finally:
        await conn.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"inbox_deleted": 2500, "batches": 3}  # 1,000 at a time
    assert (left, total) == (3, 3)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["purge", "--inbox"], "error: purge --inbox needs --older-than-days N"),
        (["purge", "--older-than-days", "3"], "error: --older-than-days applies to purge --inbox"),
        (["purge", "--inbox", "--older-than-days", "0"], "argument --older-than-days: must be"),
        (["purge", "--inbox", "--older-than-days", "a week"], "argument --older-than-days: must"),
    ],
    ids=["no days", "days without --inbox", "zero days", "not a number"],
)
async def test_purge_inbox_flags_are_checked_by_name_before_connecting(
    args: list[str], expected: str
) -> None:
    env = {"OUTBOX_DATABASE_URL": f"postgresql://consumer:pw-in-url@127.0.0.1:{free_port()}/x"}
    done = await run_cli(*args, env=env)
    assert done.returncode == 2
    assert expected in done.stderr
    assert done.stdout == ""
    assert "database" not in done.stderr  # refused before any connection was tried


@pytest.mark.parametrize(
    "args", [["migrate", "--inbox"], ["purge", "--inbox", "--older-than-days", "7"]]
)
async def test_inbox_commands_report_a_database_error_without_the_password(
    args: list[str],
) -> None:
    env = {"OUTBOX_DATABASE_URL": f"postgresql://consumer:pw-in-url@127.0.0.1:{free_port()}/x"}
    done = await run_cli(*args, env=env)
    assert done.returncode == 1
    assert "error: database: ConnectionRefusedError" in done.stderr
    assert "pw-in-url" not in done.stderr
    assert "Traceback" not in done.stderr


async def test_inbox_commands_without_a_database_url_name_the_setting(tmp_path: Any) -> None:
    done = await run_cli("migrate", "--inbox", env={"OUTBOX_LOCAL_DIR": str(tmp_path)})
    assert done.returncode == 2
    assert "OUTBOX_DATABASE_URL: is required but not set" in done.stderr
