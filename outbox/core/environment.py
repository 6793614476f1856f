"""The settings' names in the environment, and the two settings a producer reads there.

``env_name`` is the name of every setting (``outbox.core.settings`` reads and reports them by it).
A producer reads ``OUTBOX_MAX_PAYLOAD_BYTES`` at each ``enqueue`` and ``OUTBOX_WAKEUP`` at each
``notify``, by the names the relay's ``Settings`` read (in any case), so that one setting governs
both sides; here, without the ``Settings`` model, so that pydantic-settings is no part of a
producer's import. A payload limit that is set is checked by the relay's own rule
(``settings.checked_payload_limit``), loaded then.
"""

from __future__ import annotations

import os

from outbox.core.errors import ConfigurationError

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576

# Environment names of fields whose name is not OUTBOX_<FIELD>.
_ENV_NAMES = {
    "queue_connection": "AzureWebJobsStorage",
    "queue_service_uri": "AzureWebJobsStorage__queueServiceUri",
    "queue_account_name": "AzureWebJobsStorage__accountName",
    "queue_credential": "AzureWebJobsStorage__credential",
    "queue_client_id": "AzureWebJobsStorage__clientId",
}


def env_name(field: str) -> str:
    """The environment variable (app setting) that sets ``field``."""
    if field in _ENV_NAMES.values():
        return field
    return _ENV_NAMES.get(field, f"OUTBOX_{field.upper()}")


def payload_limit() -> int:
    """``OUTBOX_MAX_PAYLOAD_BYTES`` as producers apply it (the default where it is not set).

    Read at each call, and as the relay's Settings read it (the name in any case), so one setting
    governs both sides.
    """
    raw = _read(env_name("max_payload_bytes"))
    if raw is None:
        return DEFAULT_MAX_PAYLOAD_BYTES
    from outbox.core.settings import checked_payload_limit  # noqa: PLC0415 - see the docstring

    return checked_payload_limit(raw)


def wakes_by_postgres() -> bool:
    """Whether ``OUTBOX_WAKEUP`` asks for wake-ups over PostgreSQL (producers read it at each
    notify, as the relay's Settings do); ConfigurationError for a value other than the two."""
    name = env_name("wakeup")
    raw = _read(name)
    if raw in (None, "queue"):
        return False
    if raw == "postgres":
        return True
    raise ConfigurationError(f"invalid configuration: {name}: must be 'queue' or 'postgres'")


def _read(name: str) -> str | None:
    """The environment's value of ``name``, else of the same name in another case."""
    raw = os.environ.get(name)
    if raw is None:
        raw = next((v for k, v in os.environ.items() if k.upper() == name.upper()), None)
    return raw
