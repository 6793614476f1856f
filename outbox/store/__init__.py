"""The store: the only layer that runs SQL (asyncpg), its named statements, the migrations and the
partitioned layout. Imports only ``outbox.core``.

A module per caller, each readable alone:

- ``contract``: ``RelayStore``, what the relay asks of a store, with the values it takes and gives;
  kept by ``postgres.PostgresStore`` and by ``memory.MemoryStore`` (the relay's unit tests)
- ``postgres``: ``PostgresStore``, the relay's statements (``outcome_rows``: how it binds a batch)
- ``caller``: the statements a producer or consumer runs in its own transaction
- ``connection``: the pool, a connection, the driver-error boundary, the execution helpers
- ``sql``: named statements (``queries.sql``), ``notify``: the wake-up channel's LISTEN
- ``schema``, ``migrate``: the migrations; ``partitions``: the partitioned layout; ``entra``

``from outbox import store`` gives the contract, ``PostgresStore``, the caller's statements and
``QUERIES``, each loaded on first use: a producer's import loads no driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.store.caller import Statement, claim_inbox, insert_message, wakeup_statement
    from outbox.store.contract import BreakerSeen, Key, Lease, RelayStore, SentAttempt, Written
    from outbox.store.postgres import PostgresStore
    from outbox.store.sql import QUERIES

# Each name of ``__all__`` and the module that holds it.
_HOMES = {
    "BreakerSeen": "contract",
    "Key": "contract",
    "Lease": "contract",
    "RelayStore": "contract",
    "SentAttempt": "contract",
    "Written": "contract",
    "PostgresStore": "postgres",
    "QUERIES": "sql",
    "Statement": "caller",
    "claim_inbox": "caller",
    "insert_message": "caller",
    "wakeup_statement": "caller",
}

__all__ = [
    "QUERIES",
    "BreakerSeen",
    "Key",
    "Lease",
    "PostgresStore",
    "RelayStore",
    "SentAttempt",
    "Statement",
    "Written",
    "claim_inbox",
    "insert_message",
    "wakeup_statement",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
