"""``python -m outbox grant ROLE``: the relay's own database role, made where missing and given
what the relay needs, and nothing more; run by the role that migrated (the tables' owner).

- The role: where Azure Database for PostgreSQL's Microsoft Entra functions exist (in this
  database or in the server's ``postgres`` database, where Microsoft documents running them),
  ``pgaadauth_create_principal_with_oid`` (given the identity's object id) or
  ``pgaadauth_create_principal``; elsewhere a plain ``CREATE ROLE … LOGIN`` (its password or other
  sign-in is the administrator's to set). A role that exists is kept as it is.
- In the outbox's schema: ``USAGE``; ``SELECT, INSERT, UPDATE, DELETE`` on the outbox's tables
  (``outbox_*``: messages, attempts, endpoints, actions, ids, every partition; not the consumer
  inbox's), ``SELECT`` on the migrations' bookkeeping, ``USAGE, SELECT`` on its sequences,
  ``EXECUTE`` on the partition maintenance functions (migration 0021), which the purge of the
  partitioned layout needs where the role owns nothing.
- Default privileges for the tables' owner in that schema, so that the tables, partitions and
  functions a later migration (or the purge) makes are the relay's to use too. They apply to
  anything that owner makes in that schema: ``--no-default-privileges`` leaves them out (then run
  ``grant`` again after each ``migrate``).

Every step is idempotent: ``grant`` runs again with the same result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from outbox.core.errors import MigrationError
from outbox.operations import sql
from outbox.store import connection
from outbox.store.connection import Connection

TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
BOOKKEEPING = ("outbox_migrations", "outbox_inbox_migrations")
NOT_THE_RELAYS = ("outbox_inbox",)  # the consumer inbox's table, where it shares the database
MAINTENANCE_FUNCTIONS = (
    "outbox_make_partition(regclass, text, timestamptz, timestamptz)",
    "outbox_drop_partition(regclass, text, timestamptz, timestamptz, uuid[])",
)
ENTRA_TYPES = ("service", "user", "group")

OtherDatabase = Callable[[str], Awaitable[Connection]]


@dataclass(slots=True)
class GrantReport:
    role: str
    created: str | None = None  # "entra" or "role"; None: it existed
    schema: str = ""
    tables: list[str] = field(default_factory=list)
    read_only: list[str] = field(default_factory=list)
    sequences: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    default_privileges_of: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def grant(
    conn: Connection,
    role: str,
    *,
    other_database: OtherDatabase | None = None,
    entra_object_id: str | None = None,
    entra_type: str = "service",
    default_privileges: bool = True,
) -> GrantReport:
    """Make ``role`` where missing and grant it the relay's privileges on ``conn``'s database.

    ``other_database(name)`` connects to another database of the same server, as the same user:
    the Microsoft Entra functions live in ``postgres``."""
    if entra_type not in ENTRA_TYPES:
        raise MigrationError(f"the Entra principal type must be one of {', '.join(ENTRA_TYPES)}")
    owner = await sql.value(conn, "outbox_owner")
    if owner is None:
        raise MigrationError("no outbox_messages table here: run python -m outbox migrate first")
    report = GrantReport(role=role)
    if not await sql.value(conn, "role_exists", role):
        report.created = await _create_role(conn, role, other_database, entra_object_id, entra_type)
    async with conn.transaction():
        await _grant_in_schema(conn, role, report)
        if default_privileges:
            await _default_privileges(conn, role, owner, report.schema)
            report.default_privileges_of = owner
    return report


async def _create_role(
    conn: Connection,
    role: str,
    other_database: OtherDatabase | None,
    entra_object_id: str | None,
    entra_type: str,
) -> str:
    entra = await _entra_connection(conn, other_database)
    if entra is None:
        if entra_object_id is not None:
            raise MigrationError(
                "--entra-object-id: this server has no Microsoft Entra functions "
                "(pgaadauth_create_principal_with_oid); it is not Azure Database for PostgreSQL "
                "with Entra authentication on"
            )
        await _execute(conn, f"CREATE ROLE {await _quoted(conn, role)} LOGIN")
        return "role"
    try:
        if entra_object_id is not None:
            await sql.value(
                entra, "create_entra_principal_with_oid", role, entra_object_id, entra_type
            )
        else:
            await sql.value(entra, "create_entra_principal", role)
    finally:
        if entra is not conn:
            await entra.close()
    return "entra"


async def _entra_connection(
    conn: Connection, other_database: OtherDatabase | None
) -> Connection | None:
    """A connection to a database that has the Entra functions (this one, else ``postgres``)."""
    if await sql.value(conn, "has_entra_functions"):
        return conn
    if other_database is None or await sql.value(conn, "current_database") == "postgres":
        return None
    if not await sql.value(conn, "is_azure"):
        return None  # not Azure: no need to look further
    other = await other_database("postgres")
    if await sql.value(other, "has_entra_functions"):
        return other
    await other.close()
    return None


async def _grant_in_schema(conn: Connection, role: str, report: GrantReport) -> None:
    grantee = await _quoted(conn, role)
    report.schema = await sql.value(conn, "current_schema")
    schema = await _quoted(conn, report.schema)
    database = await _quoted(conn, await sql.value(conn, "current_database"))
    await _execute(conn, f"GRANT CONNECT ON DATABASE {database} TO {grantee}")
    await _execute(conn, f"GRANT USAGE ON SCHEMA {schema} TO {grantee}")
    for name, kind in await _outbox_relations(conn):
        quoted = f"{schema}.{await _quoted(conn, name)}"
        if kind == "S":
            await _execute(conn, f"GRANT USAGE, SELECT ON SEQUENCE {quoted} TO {grantee}")
            report.sequences.append(name)
        elif name in BOOKKEEPING:
            await _execute(conn, f"GRANT SELECT ON {quoted} TO {grantee}")
            report.read_only.append(name)
        else:
            await _execute(conn, f"GRANT {TABLE_PRIVILEGES} ON {quoted} TO {grantee}")
            report.tables.append(name)
    for function in MAINTENANCE_FUNCTIONS:
        if await sql.value(conn, "function_exists", function):
            await _execute(conn, f"GRANT EXECUTE ON FUNCTION {schema}.{function} TO {grantee}")
            report.functions.append(function.split("(", 1)[0])


async def _outbox_relations(conn: Connection) -> list[tuple[str, str]]:
    rows = await sql.rows(conn, "outbox_relations", list(NOT_THE_RELAYS))
    return [(row["relname"], row["kind"]) for row in rows]


async def _default_privileges(conn: Connection, role: str, owner: str, schema_name: str) -> None:
    grantee = await _quoted(conn, role)
    prefix = (
        f"ALTER DEFAULT PRIVILEGES FOR ROLE {await _quoted(conn, owner)} "
        f"IN SCHEMA {await _quoted(conn, schema_name)}"
    )
    await _execute(conn, f"{prefix} GRANT {TABLE_PRIVILEGES} ON TABLES TO {grantee}")
    await _execute(conn, f"{prefix} GRANT USAGE, SELECT ON SEQUENCES TO {grantee}")
    await _execute(conn, f"{prefix} GRANT EXECUTE ON FUNCTIONS TO {grantee}")


async def _quoted(conn: Connection, name: str) -> str:
    quoted: str = await sql.value(conn, "quote_ident", name)
    return quoted


async def _execute(conn: Connection, statement: str) -> None:
    """A GRANT or CREATE ROLE made of names the server quoted (``_quoted``)."""
    await connection.execute(conn, statement)
