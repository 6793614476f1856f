"""Passwordless PostgreSQL (OUTBOX_DATABASE_AUTH=entra): a Microsoft Entra token is each new
connection's password, for the relay's pool, the CLI and ``serve``.

Entra itself cannot run here: a fake credential hands out the tokens (the one mock). The server
is a real PostgreSQL that checks passwords, the role's password set to the token expected.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from azure.core.exceptions import ClientAuthenticationError

from outbox import entra as public
from outbox.core.errors import EntraTokenError
from outbox.core.settings import Settings
from outbox.relay.runtime import Relay
from outbox.store import entra
from outbox.store.migrate import migrate
from tests.conftest import SECRET
from tests.support import password_pg, pg
from tests.support.azure import free_port
from tests.support.fake_entra import HOUR, FakeCredential
from tests.support.outbox_helpers import eventually, run_cli, seed, statuses
from tests.support.processes import ROOT, Child
from tests.support.receiver import Receiver

FIRST = "token-first-9f0c2d"
KEY = "entra-test-function-key-0123456789"
# What a managed identity's endpoint says when the app has no identity (shortened): two lines.
NO_IDENTITY = (
    "ManagedIdentityCredential authentication unavailable. No identity has been assigned to this "
    "resource.\nError details: the request to the IMDS endpoint failed"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[password_pg.PasswordServer]:
    started = password_pg.start(tmp_path_factory.mktemp("entra") / "pg", FIRST)
    yield started
    started.stop()


@pytest.fixture
async def admin(server: password_pg.PasswordServer) -> AsyncIterator[Any]:
    """The outbox database as its administrator (trusted), migrated and emptied."""
    conn = await asyncpg.connect(pg.with_database(server.admin, password_pg.DATABASE))
    await migrate(conn)
    await conn.execute("TRUNCATE outbox_messages CASCADE")
    await server.set_password(FIRST)
    yield conn
    await conn.close()


@pytest.fixture
def credential(monkeypatch: pytest.MonkeyPatch) -> FakeCredential:
    """The credential that azure-identity would give (the test sets its tokens)."""
    fake = FakeCredential([(FIRST, HOUR)])
    monkeypatch.setattr(entra, "default_credential", lambda client_id=None: fake)
    monkeypatch.setattr(entra, "_shared", {})
    return fake


def settings_for(server: password_pg.PasswordServer, receiver: Receiver) -> Settings:
    return Settings.load(
        database_url=server.url,
        database_auth="entra",
        webhooks={"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}},
    )


def child_env(
    server: password_pg.PasswordServer, receiver: Receiver, **more: str
) -> dict[str, str]:
    return {
        "OUTBOX_DATABASE_URL": server.url,
        "OUTBOX_DATABASE_AUTH": "entra",
        "OUTBOX_WEBHOOKS": json.dumps(
            {"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}}
        ),
        "PYTHONPATH": str(ROOT),
        **more,
    }


async def test_the_server_refuses_a_wrong_password(
    server: password_pg.PasswordServer, admin: Any
) -> None:
    """What makes the tests below prove something: the token is checked."""
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(server.url, password="not-the-token")
    conn = await asyncpg.connect(server.url, password=FIRST)
    assert await conn.fetchval("SELECT current_user") == password_pg.ROLE
    await conn.close()


async def test_the_relay_signs_in_with_the_token_and_delivers(
    server: password_pg.PasswordServer,
    admin: Any,
    receiver: Receiver,
    credential: FakeCredential,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await seed(admin, 2)
    relay = await Relay.open(settings_for(server, receiver))
    try:
        summary = await relay.drain()
    finally:
        await relay.close()
    assert (summary.processed, summary.error) == (2, None)
    assert await statuses(admin) == {"Processed": 2}
    assert credential.scopes == [("https://ossrdbms-aad.database.windows.net/.default",)]
    assert FIRST not in caplog.text


async def test_a_new_connection_gets_a_new_token_when_the_kept_one_nears_its_expiry(
    server: password_pg.PasswordServer,
    admin: Any,
    receiver: Receiver,
    credential: FakeCredential,
) -> None:
    # The first token has less than the refresh margin left: kept for no other connection.
    credential.tokens = [(FIRST, entra.REFRESH_MARGIN_SECONDS - 60), ("token-second-51aa", HOUR)]
    relay = await Relay.open(settings_for(server, receiver))
    try:
        async with relay.pool.acquire() as first:
            assert await first.fetchval("SELECT 1") == 1
            assert credential.calls == 1
            await server.set_password("token-second-51aa")  # what Entra now hands out
            async with relay.pool.acquire() as second:  # a new connection of the pool
                assert await second.fetchval("SELECT current_user") == password_pg.ROLE
                assert credential.calls == 2
                async with relay.pool.acquire() as third:  # the second token is kept
                    assert await third.fetchval("SELECT 1") == 1
        assert credential.calls == 2
    finally:
        await relay.close()


async def test_a_credential_that_fails_is_one_clear_line_and_the_run_an_error(
    server: password_pg.PasswordServer,
    admin: Any,
    receiver: Receiver,
    credential: FakeCredential,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    credential.error = ClientAuthenticationError(NO_IDENTITY)
    await seed(admin, 1)
    relay = await Relay.open(settings_for(server, receiver))
    try:
        summary = await relay.drain()
    finally:
        await relay.close()
    assert summary.error == (
        "database error: could not get a Microsoft Entra token for PostgreSQL: FakeCredential: "
        "ClientAuthenticationError: ManagedIdentityCredential authentication unavailable. "
        "No identity has been assigned to this resource."
    )
    assert await statuses(admin) == {"Pending": 1}  # nothing lost: the next run delivers it


async def test_the_password_is_kept_out_of_reprs_and_errors() -> None:
    password = entra.EntraPassword(FakeCredential([("token-in-repr-7d", HOUR)]))
    assert await password() == "token-in-repr-7d"
    assert "token-in-repr-7d" not in repr(password)
    failing = entra.EntraPassword(FakeCredential(error=RuntimeError("x" * 5000)))
    with pytest.raises(EntraTokenError) as caught:
        failing.sync()
    assert len(str(caught.value)) < 500
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__  # no traceback of the credential's error


async def test_the_public_helper_gives_asyncpg_pools_the_token(
    server: password_pg.PasswordServer, admin: Any
) -> None:
    credential = FakeCredential([(FIRST, HOUR)])
    password = public.password(credential=credential)
    pool = await asyncpg.create_pool(server.url, password=password, min_size=2, max_size=2)
    try:
        assert await pool.fetchval("SELECT current_user") == password_pg.ROLE
    finally:
        await pool.close()
    assert credential.calls == 1  # two connections, one token


def test_the_public_helper_gives_psycopg_and_sqlalchemy_the_token(
    server: password_pg.PasswordServer, admin: Any
) -> None:
    import psycopg
    import sqlalchemy

    credential = FakeCredential([(FIRST, HOUR)])
    password = public.password(credential=credential)
    dsn = f"host={server.socket_dir} dbname={password_pg.DATABASE} user={password_pg.ROLE}"
    with psycopg.connect(dsn, password=password.sync()) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (password_pg.ROLE,)
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://{password_pg.ROLE}@/{password_pg.DATABASE}?host={server.socket_dir}"
    )
    public.use_with_sqlalchemy(engine, password)
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("SELECT current_user")).scalar() == password_pg.ROLE
    engine.dispose()
    assert credential.calls == 1


async def test_the_public_helper_gives_sqlalchemys_asyncpg_engine_the_token(
    server: password_pg.PasswordServer, admin: Any
) -> None:
    import sqlalchemy
    from sqlalchemy.ext.asyncio import create_async_engine

    credential = FakeCredential([(FIRST, HOUR)])
    engine = create_async_engine(
        f"postgresql+asyncpg://{password_pg.ROLE}@/{password_pg.DATABASE}?host={server.socket_dir}"
    )
    public.use_with_sqlalchemy(engine, public.password(credential=credential))
    async with engine.connect() as conn:
        result = await conn.execute(sqlalchemy.text("SELECT current_user"))
        assert result.scalar() == password_pg.ROLE
    await engine.dispose()
    assert credential.calls == 1


async def run_with_fake_entra(*args: str, env: dict[str, str]) -> Any:
    return await run_cli(*args, env=env, module="tests.support.fake_entra")


async def test_the_cli_signs_in_with_the_token(
    server: password_pg.PasswordServer, admin: Any, receiver: Receiver
) -> None:
    await seed(admin, 1)
    env = child_env(server, receiver, FAKE_ENTRA_TOKEN=FIRST)
    migrated = await run_with_fake_entra("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    status = await run_with_fake_entra("status", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["Pending"] == 1
    wrong = await run_with_fake_entra("status", env={**env, "FAKE_ENTRA_TOKEN": "stale-token"})
    assert wrong.returncode != 0
    assert "password authentication failed" in wrong.stderr
    assert "stale-token" not in wrong.stderr + wrong.stdout
    assert FIRST not in migrated.stderr + status.stderr + status.stdout


async def test_the_cli_says_in_one_line_why_it_has_no_token(
    server: password_pg.PasswordServer, admin: Any, receiver: Receiver
) -> None:
    env = child_env(server, receiver, FAKE_ENTRA_TOKEN=FIRST, FAKE_ENTRA_ERROR=NO_IDENTITY)
    result = await run_with_fake_entra("status", env=env)
    assert result.returncode != 0
    assert result.stderr.splitlines() == [
        "error: database: could not get a Microsoft Entra token for PostgreSQL: FakeCredential: "
        "ClientAuthenticationError: ManagedIdentityCredential authentication unavailable. "
        "No identity has been assigned to this resource."
    ]
    assert FIRST not in result.stderr + result.stdout


async def test_serve_signs_in_with_the_token(
    server: password_pg.PasswordServer, admin: Any, receiver: Receiver, tmp_path: Path
) -> None:
    await seed(admin, 1)
    port = free_port()
    env = child_env(
        server,
        receiver,
        FAKE_ENTRA_TOKEN=FIRST,
        OUTBOX_FUNCTION_KEY=KEY,
        OUTBOX_LOCAL_DIR=str(tmp_path),
    )
    child = await Child.start("tests.support.fake_entra", "serve", "--port", str(port), env=env)
    try:
        await child.wait_for_line(r"serving \d+ functions")

        async def delivered() -> bool:
            return await statuses(admin) == {"Processed": 1}

        await eventually(delivered, timeout=60)
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://127.0.0.1:{port}/api/outbox/status", headers={"x-functions-key": KEY}
            ) as response,
        ):
            assert response.status == 200
    finally:
        await child.kill()
    assert FIRST not in child.output
