"""Every knob of the relay: its environment name, default and bounds.

Settings come from the environment, which on Azure Functions means the app settings (and locally
``local.settings.json``). A bad value fails at start-up with a message that names the setting; the
value itself is never echoed, because several settings carry secrets.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import json
import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self, cast
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from yarl import URL

from outbox.core.environment import (
    DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES,  # noqa: PLC0414 - the store's from here
)
from outbox.core.environment import env_name
from outbox.core.errors import ConfigurationError

SECRET_PREFIX = "whsec_"  # noqa: S105 - the Standard Webhooks prefix, not a secret
DEFAULT_QUEUE_NAME = "outbox-wakeup"
# The PostgreSQL NOTIFY channel of OUTBOX_WAKEUP=postgres.
WAKEUP_CHANNEL = "outbox_wakeup"
# PostgreSQL's NOTIFY queue in use above this fraction is reported by status, and makes
# ``outbox serve`` poll (OUTBOX_WAKEUP=postgres). PostgreSQL warns in its own log from the same
# point; a healthy queue holds only what listeners have not read yet (a few pages of 8 KB, under
# 0.1 % of the default 8 GB), and half of it left is room to act before NOTIFY fails.
NOTIFY_QUEUE_ALERT_USAGE = 0.5
# OUTBOX_CONCURRENCY's default: requests in flight per process (docs/performance.md).
DEFAULT_CONCURRENCY = 1024
# ... and on a consumption-billed Functions plan, whose instances may hold 600 active outbound
# connections (Azure Functions' service limits; the Flex Consumption plan is kept at the same
# number, no limit being published for it).
CONSUMPTION_CONCURRENCY = 512
# WEBSITE_SKU, which Azure sets on every Functions app: the plans billed by consumption.
CONSUMPTION_SKUS = frozenset({"dynamic", "flexconsumption"})
# A delivery starts only if it can time out this long before its lease does.
LEASE_SAFETY_SECONDS = 1.0
PayloadLimit = Annotated[int, Field(ge=1024, le=64 * 1_048_576)]
# Azure Storage queue names: 3-63 characters, lowercase letters, digits and single hyphens.
_QUEUE_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")

# The `sslmode` values asyncpg understands (it also takes `_` for `-`).
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_BAD_PORT = "has a port that is not a number from 1 to 65535"
NOT_A_URL = "is not a valid URL (percent-encode special characters such as [ ] in a password)"
# An OUTBOX_WEBHOOKS key is named in an error only if it looks like an event type or a field:
# anything else may be a URL or a secret put in the wrong place.
_NAMEABLE_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
# A console key's name (OUTBOX_CONSOLE_KEYS, OUTBOX_CONSOLE_VIEW_KEYS): who acted, in the record.
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")
MIN_KEY_CHARS = 16
# Who a caller of OUTBOX_FUNCTION_KEY or OUTBOX_CONSOLE_VIEW_KEY is, in the record of actions.
FUNCTION_KEY_NAME = "function key"
VIEW_KEY_NAME = "view key"
# Headers the relay sets itself (or that frame the request): an endpoint cannot override them.
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "traceparent",
        "tracestate",
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
    }
)
# Tags of the two forms an event type's endpoints may take; left out of error locations.
_ONE, _MANY = "endpoint", "endpoints"
_SECRET_PREFIXES = ("whsec_", "sk_", "sk-", "rk_", "pk_live", "ghp_", "gho_", "xox", "eyj")


def default_concurrency(
    environ: Mapping[str, str] = os.environ, descriptor_limit: int | None = None
) -> int:
    """OUTBOX_CONCURRENCY where it is not set: 512 on a Consumption or Flex Consumption plan,
    1,024 elsewhere (Premium, Dedicated, ``outbox serve``); in either case at most half the
    process's file descriptor limit (``descriptor_limit``, by default ``ulimit -n``), so that a
    connection per request leaves the rest for the database, the queue and ``serve``'s port."""
    on_consumption = environ.get("WEBSITE_SKU", "").strip().lower() in CONSUMPTION_SKUS
    plan = CONSUMPTION_CONCURRENCY if on_consumption else DEFAULT_CONCURRENCY
    limit = descriptor_limit if descriptor_limit is not None else open_files_limit()
    return plan if limit is None else max(1, min(plan, limit // 2))


def open_files_limit() -> int | None:
    """The process's soft limit of open files (``ulimit -n``), or None where there is none (no
    limit, or not POSIX)."""
    try:
        import resource  # noqa: PLC0415 - POSIX only: a producer may import settings on Windows
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def _is_port(text: str) -> bool:
    """Whether ``text`` is empty (the default port) or a TCP port number."""
    if not text:
        return True
    try:
        return 1 <= int(text) <= 65535
    except ValueError:
        return False


def _database_url_problem(url: str) -> str | None:
    """What asyncpg would choke on at the first connection, found at load instead.

    It parses the URL as asyncpg does (several ``host:port`` pairs may be comma-separated, and
    ``host``/``port`` may come in the query) and never quotes it: the URL holds a password.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # its message can quote part of the URL (brackets in a password)
        return NOT_A_URL
    if parts.scheme not in ("postgres", "postgresql"):
        return "must be a postgresql:// URL"
    try:
        query = parse_qs(parts.query, strict_parsing=True) if parts.query else {}
    except ValueError:
        return "has a malformed query string"
    hosts = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    ports = [_host_port(spec) for spec in hosts.split(",")] if hosts else []
    ports += query.get("port", [""])[-1].split(",")
    if not all(_is_port(port) for port in ports):
        return _BAD_PORT
    if query.get("sslmode", ["prefer"])[-1].replace("_", "-") not in _SSL_MODES:
        return f"sslmode must be one of: {', '.join(_SSL_MODES)}"
    return None


def _host_port(spec: str) -> str:
    """The port part of one ``host[:port]`` of a PostgreSQL URL ('' when it has none)."""
    if spec.startswith("/"):  # a Unix socket directory
        return ""
    if spec.startswith("["):  # [IPv6]:port
        return unquote(spec.partition("]")[2].removeprefix(":"))
    return unquote(spec.partition(":")[2])


def decode_secret(part: str) -> bytes:
    """The HMAC key inside one ``whsec_<base64>`` secret; a ValueError without it if malformed."""
    if not part.startswith(SECRET_PREFIX):
        raise ValueError(f"each secret must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(part[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error:
        raise ValueError(f"the part after {SECRET_PREFIX!r} must be base64") from None
    if len(key) < 16:
        raise ValueError("a secret must decode to at least 16 bytes")
    return key


class WebhookEndpoint(BaseModel):
    """One subscriber of an event type: where its messages go, signed how, with which headers
    and limits. ``name`` identifies it (logs, ``show``, ``status``, requeue); a single endpoint
    of an event type is named after the event type unless it says otherwise."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    secret: SecretStr | None = None
    name: str | None = None
    # Extra request headers (Authorization, X-Api-Key…); their values are secrets.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    timeout_seconds: float | None = Field(default=None, gt=0, le=300)
    max_concurrency: int | None = Field(default=None, ge=1, le=256)
    # Statuses that fail a message at once here (besides 410 Gone), e.g. [400, 422].
    final_statuses: tuple[int, ...] = ()

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str | None) -> str | None:
        if name is not None and (not _NAMEABLE_KEY.match(name) or looks_secret(name)):
            raise ValueError(
                "name must be 1-100 letters, digits, '_', '.', ':' or '-' (and not look like a "
                "secret: it is shown in logs and status)"
            )
        return name

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for header, value in headers.items():
            if not _HEADER_NAME.match(header):
                raise ValueError("a header name must be an HTTP token (letters, digits, -…)")
            if header.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {header} is the relay's own and cannot be set here")
            if any(c in value.get_secret_value() for c in "\r\n\x00"):
                raise ValueError(f"header {header}'s value holds a line break or NUL")
        return headers

    @field_validator("final_statuses")
    @classmethod
    def _check_final_statuses(cls, statuses: tuple[int, ...]) -> tuple[int, ...]:
        if not all(300 <= status <= 599 for status in statuses):
            raise ValueError("final_statuses must be HTTP statuses from 300 to 599")
        return statuses

    def timeout(self, default: float) -> float:
        """Seconds one request may take: its own timeout, else the relay's."""
        return self.timeout_seconds or default

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
        except ValueError:  # its message can quote part of the URL (brackets in a password)
            raise ValueError(f"url {NOT_A_URL}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an absolute http:// or https:// URL")
        # Caught here, not at each delivery, whose error must redact the URL (it may be a secret).
        try:
            bad_port = parts.port == 0
        except ValueError:  # not a number, or above 65535
            bad_port = True
        if bad_port:
            raise ValueError(f"url {_BAD_PORT}")
        try:
            URL(url)  # as aiohttp will parse it at each delivery
        except ValueError:
            raise ValueError("url is not a URL that aiohttp can parse") from None
        return url

    @field_validator("secret")
    @classmethod
    def _check_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        if secret is not None:
            parts = secret.get_secret_value().split()
            if not parts:
                raise ValueError("secret is empty; omit it to send unsigned requests")
            for part in parts:
                decode_secret(part)
        return secret

    @property
    def signing_keys(self) -> tuple[bytes, ...]:
        """One HMAC key per configured secret (several during a rotation)."""
        if self.secret is None:
            return ()
        return tuple(decode_secret(part) for part in self.secret.get_secret_value().split())


def _form(value: Any) -> str:
    return _MANY if isinstance(value, list | tuple) else _ONE


_Endpoints = Annotated[
    Annotated[WebhookEndpoint, Tag(_ONE)] | Annotated[list[WebhookEndpoint], Tag(_MANY)],
    Discriminator(_form),
]


class QueueSettings(BaseSettings):
    """Where wake-up hints go: all a producer needs (none of the relay's other settings)."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
        allow_inf_nan=False,  # an infinite threshold or timeout would switch a safeguard off
    )

    # How producers and relays wake one another: the Azure Storage queue (the Functions app's
    # only option) or PostgreSQL's NOTIFY on WAKEUP_CHANNEL, which ``outbox serve`` LISTENs to.
    wakeup: Literal["queue", "postgres"] = "queue"
    queue_name: str = DEFAULT_QUEUE_NAME
    queue_connection: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("AzureWebJobsStorage", "queue_connection")
    )
    queue_service_uri: str | None = Field(
        default=None,
        validation_alias=AliasChoices("AzureWebJobsStorage__queueServiceUri", "queue_service_uri"),
    )
    queue_account_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("AzureWebJobsStorage__accountName", "queue_account_name"),
    )
    # As the Functions host reads them: `managedidentity` (any case) and a user-assigned
    # identity's client id; unset, DefaultAzureCredential.
    queue_credential: str | None = Field(
        default=None,
        validation_alias=AliasChoices("AzureWebJobsStorage__credential", "queue_credential"),
    )
    queue_client_id: str | None = Field(
        default=None,
        validation_alias=AliasChoices("AzureWebJobsStorage__clientId", "queue_client_id"),
    )

    @field_validator("queue_name")
    @classmethod
    def _check_queue_name(cls, name: str) -> str:
        if not _QUEUE_NAME.match(name):
            raise ValueError(
                "must be a valid Azure Storage queue name: 3-63 lowercase letters, digits "
                "and single hyphens, starting and ending with a letter or digit"
            )
        return name

    @field_validator("queue_credential")
    @classmethod
    def _check_queue_credential(cls, value: str | None) -> str | None:
        if value is not None and value.lower() != "managedidentity":
            raise ValueError("must be managedidentity (or unset: DefaultAzureCredential)")
        return value

    @property
    def wakes_by_postgres(self) -> bool:
        """Whether wake-ups go over PostgreSQL's NOTIFY (OUTBOX_WAKEUP=postgres)."""
        return self.wakeup == "postgres"

    @property
    def has_queue(self) -> bool:
        """Whether a wake-up queue connection is configured (connection string or identity)."""
        return bool(self.queue_connection or self.queue_service_uri or self.queue_account_name)

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Read settings from the environment; raise ConfigurationError naming each bad setting."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise ConfigurationError(describe_errors(exc)) from None


class Settings(QueueSettings):
    """The relay's configuration. ``Settings.load()`` reads it from the environment."""

    database_url: SecretStr
    # password: OUTBOX_DATABASE_URL's own; entra: a Microsoft Entra access token (outbox.entra).
    database_auth: Literal["password", "entra"] = "password"
    database_client_id: str | None = None  # a user-assigned managed identity's client id
    # Event type → one endpoint or a list of them; after validation, a tuple of them, each named.
    webhooks: Annotated[dict[str, _Endpoints], NoDecode] = Field(default_factory=dict)
    batch_size: int = Field(default=100, ge=1, le=1000)
    lease_seconds: float = Field(default=60.0, ge=1, le=3600)
    max_attempts: int = Field(default=10, ge=1, le=100)
    http_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    concurrency: int = Field(default_factory=default_concurrency, ge=1, le=4096)
    run_budget_seconds: float = Field(default=240.0, gt=0, le=3600)
    max_payload_bytes: PayloadLimit = DEFAULT_MAX_PAYLOAD_BYTES
    db_pool_size: int = Field(default=4, ge=2, le=100)
    ordering_on_failure: Literal["hold", "release"] = "hold"
    alert_oldest_pending_seconds: float = Field(default=900.0, gt=0)
    retention_days: int = Field(default=7, ge=1, le=3650)
    failed_retention_days: int | None = Field(default=None, ge=1, le=3650)
    purge_batch_size: int = Field(default=1000, ge=1, le=100_000)
    function_key: SecretStr | None = None  # `outbox serve`: the key its HTTP functions require
    # `outbox serve`: a key that reads (the console, status) but cannot act.
    console_view_key: SecretStr | None = None
    # `outbox serve`: keys by name (JSON object name → key); the name is who acted, in the record
    # of actions. Those of console_keys may act, those of console_view_keys only read.
    console_keys: Annotated[dict[str, SecretStr] | None, NoDecode] = None
    console_view_keys: Annotated[dict[str, SecretStr] | None, NoDecode] = None

    @field_validator("function_key", "console_view_key")
    @classmethod
    def _check_function_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(key.get_secret_value()) < MIN_KEY_CHARS:
            raise ValueError(f"must be at least {MIN_KEY_CHARS} characters")
        return key

    @field_validator("console_keys", "console_view_keys", mode="before")
    @classmethod
    def _parse_named_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else None
            except json.JSONDecodeError as exc:
                # exc.msg and the position only: the text holds keys.
                raise ValueError(
                    f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                ) from None
        if value is not None and not isinstance(value, Mapping):
            raise ValueError('must be a JSON object of names and keys: {"alice": "…"}')
        return value

    @field_validator("console_keys", "console_view_keys")
    @classmethod
    def _check_named_keys(cls, value: dict[str, SecretStr] | None) -> dict[str, SecretStr] | None:
        for name, key in (value or {}).items():
            if not _KEY_NAME.match(name) or looks_secret(name):
                raise ValueError(
                    f"key name {_shown(name, quoted=True)}: a name is 1 to 64 letters, digits "
                    "and . _ @ + - (it names who acted in the record of actions), never a key"
                )
            if len(key.get_secret_value()) < MIN_KEY_CHARS:
                raise ValueError(f"the key of {name!r} must be at least {MIN_KEY_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _check_keys_differ(self) -> Self:
        named = [*(self.console_keys or {}), *(self.console_view_keys or {})]
        if len(set(named)) < len(named):
            raise ValueError(
                f"{env_name('console_keys')} and {env_name('console_view_keys')} must not give "
                "a name twice"
            )
        keys = [key.get_secret_value() for key in self.all_keys().values()]
        if len(set(keys)) < len(keys):
            raise ValueError(
                "every key of OUTBOX_FUNCTION_KEY, OUTBOX_CONSOLE_VIEW_KEY, OUTBOX_CONSOLE_KEYS "
                "and OUTBOX_CONSOLE_VIEW_KEYS must differ from the others: a key names one caller"
            )
        return self

    def all_keys(self) -> dict[tuple[str, bool], SecretStr]:
        """Every key ``outbox serve`` takes, by (the name its caller acts under, whether it may
        act): ``function key`` and ``view key`` for the two single keys."""
        keys: dict[tuple[str, bool], SecretStr] = {}
        if self.function_key is not None:
            keys[(FUNCTION_KEY_NAME, True)] = self.function_key
        if self.console_view_key is not None:
            keys[(VIEW_KEY_NAME, False)] = self.console_view_key
        keys.update({(name, True): key for name, key in (self.console_keys or {}).items()})
        keys.update({(name, False): key for name, key in (self.console_view_keys or {}).items()})
        return keys

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, url: SecretStr) -> SecretStr:
        problem = _database_url_problem(url.get_secret_value())
        if problem:
            raise ValueError(problem)
        return url

    @model_validator(mode="after")
    def _check_database_auth(self) -> Self:
        _no_password_with_entra(self.database_url, self.database_auth)
        return self

    @field_validator("webhooks", mode="before")
    @classmethod
    def _parse_webhooks(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as exc:
                # exc.msg and the position only: the text itself may contain secrets.
                raise ValueError(
                    f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
                ) from None
        if not isinstance(value, Mapping):
            raise ValueError('must be a JSON object: {"EventType": {"url": ..., "secret": ...}}')
        return value

    @field_validator("webhooks")
    @classmethod
    def _name_endpoints(cls, value: dict[str, Any]) -> dict[str, tuple[WebhookEndpoint, ...]]:
        named: dict[str, tuple[WebhookEndpoint, ...]] = {}
        for event_type, given in value.items():
            if isinstance(given, WebhookEndpoint):
                named[event_type] = (given.model_copy(update={"name": given.name or event_type}),)
                continue
            where = f"[{_shown(event_type, quoted=True)}]"
            if not given:
                raise ValueError(f"{where}: a list of endpoints must not be empty")
            if any(endpoint.name is None for endpoint in given):
                raise ValueError(f"{where}: each endpoint of a list needs a name")
            names = [endpoint.name for endpoint in given]
            if len(set(names)) < len(names):
                raise ValueError(f"{where}: endpoint names must be unique within an event type")
            named[event_type] = tuple(given)
        return named

    @property
    def endpoints(self) -> Mapping[str, tuple[WebhookEndpoint, ...]]:
        """Each event type's endpoints, named (``webhooks`` as validated)."""
        return cast("Mapping[str, tuple[WebhookEndpoint, ...]]", self.webhooks)

    @property
    def endpoint_names(self) -> dict[str, list[str]]:
        """Each event type's endpoint names, in their configured order: what the console and
        the commands name an endpoint by."""
        return {
            event_type: [endpoint.name for endpoint in endpoints if endpoint.name is not None]
            for event_type, endpoints in self.endpoints.items()
        }

    @property
    def longest_timeout_seconds(self) -> float:
        """The longest a request may take, over every endpoint."""
        timeouts = [
            endpoint.timeout(self.http_timeout_seconds)
            for endpoints in self.endpoints.values()
            for endpoint in endpoints
        ]
        return max([self.http_timeout_seconds, *timeouts])

    @model_validator(mode="after")
    def _check_lease_outlives_timeout(self) -> Settings:
        # A delivery starts only while its lease outlives its timeout by a second; the lease must
        # leave at least one more timeout to start the batch's later requests in. With less,
        # the later messages of every batch could never start: given back, leased again, and so
        # on, without end.
        minimum = min_lease_seconds(self.longest_timeout_seconds)
        if self.lease_seconds < minimum:
            which = (
                env_name("http_timeout_seconds")
                if self.longest_timeout_seconds == self.http_timeout_seconds
                else "the longest timeout_seconds of OUTBOX_WEBHOOKS"
            )
            raise ValueError(
                f"{env_name('lease_seconds')} ({self.lease_seconds:g}) must be at least "
                f"2 * {which} + 1 = {minimum:g}: a delivery starts "
                "only while its lease outlives its timeout by 1 s, and the lease must leave "
                "one more timeout in which a batch's later requests can start"
            )
        return self

    @property
    def batch_rounds(self) -> int:
        """How many delivery rounds one batch takes at full concurrency."""
        return math.ceil(self.batch_size / self.concurrency)


def min_lease_seconds(http_timeout_seconds: float) -> float:
    """The shortest lease that leaves a delivery of this timeout a real margin."""
    return 2 * http_timeout_seconds + LEASE_SAFETY_SECONDS


def _no_password_with_entra(url: SecretStr, auth: str) -> None:
    """With ``entra``, the token is the password: one in the URL as well would be a mistake."""
    if auth == "entra" and urlsplit(url.get_secret_value()).password:
        raise ValueError(
            f"{env_name('database_url')} must hold no password when "
            f"{env_name('database_auth')} is entra (the Microsoft Entra token is the password)"
        )


class DatabaseSettings(BaseSettings):
    """Only ``OUTBOX_DATABASE_URL``: all that the consumer inbox's commands (``migrate --inbox``,
    ``purge --inbox``) read, in a service that runs no relay and has none of its settings."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore", frozen=True)

    database_url: SecretStr
    database_auth: Literal["password", "entra"] = "password"
    database_client_id: str | None = None

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, url: SecretStr) -> SecretStr:
        return Settings._check_database_url(url)

    @model_validator(mode="after")
    def _check_database_auth(self) -> Self:
        _no_password_with_entra(self.database_url, self.database_auth)
        return self

    @classmethod
    def load(cls) -> Self:
        """Read it from the environment; ConfigurationError naming it if missing or invalid."""
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigurationError(describe_errors(exc)) from None


class _PayloadLimitSetting(BaseModel):
    max_payload_bytes: PayloadLimit


@functools.lru_cache(maxsize=16)
def checked_payload_limit(raw: str) -> int:
    """A producer's ``OUTBOX_MAX_PAYLOAD_BYTES`` (``environment.payload_limit``) by the relay's
    rule; ConfigurationError naming it if out of bounds."""
    try:
        return _PayloadLimitSetting(max_payload_bytes=raw).max_payload_bytes
    except ValidationError as exc:
        raise ConfigurationError(describe_errors(exc)) from None


def describe_errors(exc: ValidationError) -> str:
    """A readable list of what is wrong, by environment name, without any input value."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False, include_context=False):
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "is required but not set"
        elif len(error["loc"]) == 1 and os.environ.get(env_name(str(error["loc"][0]))) == "":
            message = "is set but empty"  # the input is never shown; this much is safe to say
        lines.append(f"{_describe_location(error['loc'])}{message}")
    return "invalid configuration: " + "; ".join(lines)


def _describe_location(loc: tuple[int | str, ...]) -> str:
    """``OUTBOX_WEBHOOKS['OrderCompleted'].secret: `` (or ``…['OrderCompleted'][1].secret``, for
    the second of a list) for a nested error, empty for a model one."""
    if not loc:
        return ""
    key = f"[{_shown(loc[1], quoted=True)}]" if len(loc) > 1 else ""
    rest = "".join(
        f"[{part}]" if isinstance(part, int) else f".{_shown(part)}"
        for part in loc[2:]
        if part not in (_ONE, _MANY) or not isinstance(part, str)
    )
    return f"{env_name(str(loc[0]))}{key}{rest}: "


def _shown(part: int | str, *, quoted: bool = False) -> str:
    """A key or field name as it may be printed: ``<not shown>`` unless it looks like one."""
    text = str(part)
    if not _NAMEABLE_KEY.match(text) or looks_secret(text):
        return "<not shown>"
    return repr(text) if quoted else text


def looks_secret(text: str) -> bool:
    """Whether a name-shaped ``text`` may be a secret put where a name belongs: a known token
    prefix (``whsec_``, ``sk_live_``, ``ghp_``…), or long and random-looking (a name such as
    ``OrderCompleted2024`` changes between lower case, upper case and digits a few times;
    base64 or hex, at every other character)."""
    if text.lower().startswith(_SECRET_PREFIXES):
        return True
    if len(text) < 16:
        return False
    kinds = ["d" if c.isdigit() else "u" if c.isupper() else "l" for c in text if c.isalnum()]
    changes = sum(a != b for a, b in itertools.pairwise(kinds))
    return changes >= len(text) / 4
