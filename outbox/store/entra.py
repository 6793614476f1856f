"""Passwordless PostgreSQL: a Microsoft Entra access token as each new connection's password.

Azure Database for PostgreSQL accepts an Entra access token (scope ``SCOPE``) as the password of
the role made for an identity (``pgaadauth_create_principal``). ``EntraPassword`` is that
password for a driver: asyncpg takes it as ``password=`` (a coroutine function, called for each
new connection, pool connections too); sync drivers call ``EntraPassword.sync()``. The token is
kept and used again until less than ``REFRESH_MARGIN_SECONDS`` of it remain, then fetched anew.

A token is a secret: it is never logged and never put in an error. Failing to get one raises
``EntraTokenError``, one line naming the credential and the cause.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from azure.core.credentials import TokenCredential

from outbox.core.errors import ConfigurationError, EntraTokenError

if TYPE_CHECKING:
    from outbox.core.settings import DatabaseSettings, Settings

SCOPE = "https://ossrdbms-aad.database.windows.net/.default"
# A token is fetched anew when less than this is left of it: a connection opened with it must
# finish its sign-in well before it expires (Entra tokens last an hour or more).
REFRESH_MARGIN_SECONDS = 300.0
# The cause's words kept in the one-line error: credentials' messages can run to pages.
REASON_LIMIT = 300
NEEDS_AZURE_IDENTITY = (
    "OUTBOX_DATABASE_AUTH=entra needs the azure-identity package "
    '(pip install "outbox-relay[azure]")'
)


def default_credential(client_id: str | None = None) -> TokenCredential:
    """azure-identity's credential: a user-assigned managed identity's with ``client_id``, else
    ``DefaultAzureCredential`` (the app's managed identity on Azure, ``az login`` on a laptop)."""
    try:
        identity = importlib.import_module("azure.identity")  # an extra, imported when chosen
    except ImportError:
        raise ConfigurationError(NEEDS_AZURE_IDENTITY) from None
    if client_id:
        return cast(TokenCredential, identity.ManagedIdentityCredential(client_id=client_id))
    return cast(TokenCredential, identity.DefaultAzureCredential())


class EntraPassword:
    """A driver's password: a Microsoft Entra access token for PostgreSQL, kept until it nears
    its expiry. ``await password()`` (what asyncpg calls) or ``password.sync()`` (blocking)."""

    def __init__(
        self,
        credential: TokenCredential,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.credential = credential
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0

    def __repr__(self) -> str:  # never the token
        return f"EntraPassword({type(self.credential).__name__})"

    def _fresh(self) -> str | None:
        if self._token is not None and self._expires_on - self._clock() > REFRESH_MARGIN_SECONDS:
            return self._token
        return None

    def sync(self) -> str:
        """The token, fetched (blocking) if none is kept or it nears its expiry."""
        with self._lock:
            token = self._fresh()
            if token is None:
                token, self._expires_on = self._fetch()
                self._token = token
            return token

    async def __call__(self) -> str:
        """The token; a fetch runs in a thread (azure-identity's calls block)."""
        token = self._fresh()
        if token is None:
            token = await asyncio.to_thread(self.sync)
        return token

    def _fetch(self) -> tuple[str, float]:
        try:
            access = self.credential.get_token(SCOPE)
        except Exception as exc:  # noqa: BLE001 - any failure is the one line below
            raise EntraTokenError(
                f"could not get a Microsoft Entra token for PostgreSQL: "
                f"{type(self.credential).__name__}: {reason(exc)}"
            ) from None
        return access.token, float(access.expires_on)


def reason(exc: BaseException) -> str:
    """The cause in one line: the exception's class and its message's first line, shortened."""
    lines = str(exc).strip().splitlines()
    text = lines[0].strip() if lines else "(no message)"
    if len(text) > REASON_LIMIT:
        text = text[: REASON_LIMIT - 1] + "…"
    return f"{type(exc).__name__}: {text}"


def password(
    client_id: str | None = None, *, credential: TokenCredential | None = None
) -> EntraPassword:
    """An ``EntraPassword`` from ``credential``, else from azure-identity
    (``default_credential(client_id)``)."""
    return EntraPassword(credential or default_credential(client_id))


_shared: dict[str | None, EntraPassword] = {}
_shared_lock = threading.Lock()


def for_settings(settings: Settings | DatabaseSettings) -> EntraPassword | None:
    """The password the relay's connections use: with ``OUTBOX_DATABASE_AUTH=entra`` an
    ``EntraPassword`` (one per client id in the process, so its token serves every pool), else
    None (the URL's own password)."""
    if settings.database_auth != "entra":
        return None
    with _shared_lock:
        found = _shared.get(settings.database_client_id)
        if found is None:
            found = _shared[settings.database_client_id] = password(settings.database_client_id)
        return found


def use_with_sqlalchemy(engine: Any, password: EntraPassword) -> None:
    """Give each new connection of a SQLAlchemy ``engine`` (a sync ``Engine`` or an
    ``AsyncEngine``) the token as its password, through the engine's ``do_connect`` event:
    asyncpg's dialect gets ``password`` itself (asyncpg awaits it), the others its ``sync()``."""
    from sqlalchemy import event  # noqa: PLC0415 - an extra, imported when asked for

    sync_engine = getattr(engine, "sync_engine", engine)
    awaits = sync_engine.dialect.driver == "asyncpg"

    def set_password(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["password"] = password if awaits else password.sync()

    event.listen(sync_engine, "do_connect", set_password)
