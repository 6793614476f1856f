"""``outbox.entra``: passwordless PostgreSQL for a producer's own pools (``outbox.store.entra``).

A Microsoft Entra access token as the password of each new connection, from azure-identity
(``pip install "outbox-relay[azure]"``), kept until five minutes before it expires::

    from outbox import entra

    password = entra.password()  # DefaultAzureCredential; entra.password(client_id) for a
                                 # user-assigned managed identity
    pool = await asyncpg.create_pool("postgresql://app-identity@server/db", password=password)
    conn = psycopg.connect("postgresql://app-identity@server/db", password=password.sync())
    entra.use_with_sqlalchemy(engine, password)

See docs/azure.md#passwordless-postgresql.
"""

from outbox.store.entra import (
    REFRESH_MARGIN_SECONDS,
    SCOPE,
    EntraPassword,
    default_credential,
    password,
    use_with_sqlalchemy,
)

__all__ = [
    "REFRESH_MARGIN_SECONDS",
    "SCOPE",
    "EntraPassword",
    "default_credential",
    "password",
    "use_with_sqlalchemy",
]
