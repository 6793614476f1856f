"""``python -m outbox serve``: the relay's Azure Functions without the Functions host.

It hosts ``outbox.functions.bp`` (or, with ``--app module:attribute``, an app or Blueprint of
yours), indexes it as the Python worker does and calls the very same functions:

- each queue trigger: polls its queue (``%SETTING%`` names resolved from the environment), hands
  the base64-decoded message over as a ``QueueMessage``, deletes it only after the function
  succeeded, makes it visible again after ``visibilityTimeout`` when it failed, and moves it to
  ``<queue>-poison`` after ``maxDequeueCount`` attempts, with the values from ``host.json``;
- each timer trigger: fires on its NCRONTAB schedule (UTC);
- each HTTP trigger: ``/api/<route>`` on 127.0.0.1:7071 like ``func start``; auth level
  ``FUNCTION`` needs a key as ``?code=`` or an ``x-functions-key`` header: ``OUTBOX_FUNCTION_KEY``
  or one of ``OUTBOX_CONSOLE_KEYS`` (a function that only reads, GET alone, also takes
  ``OUTBOX_CONSOLE_VIEW_KEY`` and ``OUTBOX_CONSOLE_VIEW_KEYS``); the function is told which key
  matched (its name is who acted, ``outbox.azure.caller``). A wrong key is a 401 and a log line
  (address, user agent, route; never key material); after ``WRONG_KEYS_ALLOWED`` of them from one
  address within a minute, that address is answered 429 with ``Retry-After`` until the minute
  has passed (``WrongKeys``). An unknown route's 404 and a wrong method's 405 are JSON like the
  functions' answers, and every JSON answer says ``nosniff`` and ``no-store``.

``host.json`` is read from the working folder when there is one, else the package's own copy
(the repository's, shipped with it); ``%OUTBOX_QUEUE_NAME%`` defaults to ``outbox-wakeup``.

Besides, it drains on its own timer whenever the relay wants a run later (a retry's backoff, a
``Retry-After``, a breaker's reopen), with or without a queue (``drainer``); with
``OUTBOX_WAKEUP=postgres`` it LISTENs for the producers' NOTIFY and drains at each, and watches
PostgreSQL's NOTIFY queue, polling every few seconds while it is too full for NOTIFYs to be relied
on (``watch_notify_queue``). For container hosts, ``GET /healthz``, ``/readyz`` and ``/metrics``
(``health``).

SIGTERM or SIGINT stops it gracefully: no new work is taken, drains finish their in-flight
deliveries and release what they had not started, then the clients close. No row is left behind.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hmac
import importlib
import ipaddress
import json
import logging
import math
import os
import re
import signal
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import azure.functions as func
from aiohttp import web
from azure.core.exceptions import ResourceExistsError
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest
from azure.storage.queue import QueueMessage as StoredMessage
from azure.storage.queue.aio import QueueClient

from outbox.azure import functions, telemetry_setup, triggers
from outbox.azure.caller import MAX_USER_AGENT_CHARS, CheckedKey, checked_key, forwarded_for
from outbox.azure.functions import JSON_HEADERS
from outbox.azure.host import functions_host
from outbox.core import telemetry
from outbox.core.errors import ConfigurationError, DatabaseError, describe
from outbox.core.logs import Throttled, log_event
from outbox.core.redact import Redactor
from outbox.core.settings import (
    DEFAULT_QUEUE_NAME,
    FUNCTION_KEY_NAME,
    VIEW_KEY_NAME,
    QueueSettings,
    Settings,
)
from outbox.hosting import health
from outbox.hosting.connections import (
    ACCEPT_ERROR_LOG_INTERVAL_SECONDS,
    KEEPALIVE_TIMEOUT_SECONDS,
    AcceptErrors,
    Guard,
    GuardedSite,
    default_max_connections,
)
from outbox.hosting.drainer import Drainer, PostgresListener
from outbox.hosting.ncrontab import Schedule
from outbox.store.notify import notify_queue_usage
from outbox.transport.wakeup import close_queue_client, make_queue_client

logger = logging.getLogger("outbox.serve")

DEFAULT_PORT = 7071
# App settings that binding expressions may name, with the value they take when not set.
SETTING_DEFAULTS = {"OUTBOX_QUEUE_NAME": DEFAULT_QUEUE_NAME}
# How often, with OUTBOX_WAKEUP=postgres, the NOTIFY queue's usage is read: at the fastest fill
# reported (8 KB NOTIFYs, about 40 s from empty to full) it is found high long before it is full.
NOTIFY_QUEUE_CHECK_SECONDS = 5.0
# The queue listener's wait after a receive that found nothing, after one that found a message
# (the host's minimum polling interval).
MIN_POLL_SECONDS = 0.1
# Wrong keys one address may send within WRONG_KEYS_WINDOW_SECONDS before it is answered 429.
WRONG_KEYS_ALLOWED = 10
WRONG_KEYS_WINDOW_SECONDS = 60.0
# Addresses whose wrong keys are remembered at most (the oldest are forgotten first).
WRONG_KEYS_ADDRESSES = 10_000
_TIMESPAN = re.compile(r"^(\d+):(\d\d):(\d\d(?:\.\d+)?)$")
_SETTING = re.compile(r"%([^%]+)%")


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The ``extensions.queues`` settings of host.json that the listener honours."""

    max_polling_interval: float = 60.0
    visibility_timeout: float = 0.0
    max_dequeue_count: int = 5
    function_timeout: float = 300.0

    @classmethod
    def from_host_json(cls, path: Traversable) -> QueueOptions:
        try:
            host = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigurationError(f"host.json: cannot read {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise ConfigurationError(f"host.json: not valid JSON ({exc})") from None
        if not isinstance(host, dict):
            raise ConfigurationError("host.json: not a JSON object")
        queues = host.get("extensions", {}).get("queues", {})
        try:
            max_dequeue_count = int(queues.get("maxDequeueCount", 5))
        except (TypeError, ValueError):
            raise ConfigurationError("host.json: maxDequeueCount must be a whole number") from None
        return cls(
            max_polling_interval=timespan(queues.get("maxPollingInterval", "00:01:00")),
            visibility_timeout=timespan(queues.get("visibilityTimeout", "00:00:00")),
            max_dequeue_count=max_dequeue_count,
            function_timeout=timespan(host.get("functionTimeout", "00:05:00")),
        )


def timespan(text: Any) -> float:
    """Seconds in a host.json ``hh:mm:ss[.fff]`` value."""
    match = _TIMESPAN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigurationError(f"host.json: not a hh:mm:ss time span: {text!r}")
    hours, minutes, seconds = match.groups()
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def resolve(expression: str) -> str:
    """A binding expression with ``%SETTING%`` replaced from the environment, as the host does
    (except that a setting of ``SETTING_DEFAULTS`` falls back to its default)."""

    def setting(match: re.Match[str]) -> str:
        name = match.group(1)
        value = os.environ.get(name) or SETTING_DEFAULTS.get(name)
        if not value:
            raise ConfigurationError(f"app setting {name} is not set")
        return value

    return _SETTING.sub(setting, expression)


def host_json_path(given: Path | None = None) -> Traversable:
    """``given``, else ``./host.json``, else the package's copy of the repository's."""
    if given is not None:
        return given
    here = Path("host.json")
    return here if here.is_file() else resources.files("outbox").joinpath("host.json")


def load_app(spec: str | None = None) -> func.FunctionApp:
    """The app to host: ``module:attribute`` (a FunctionApp, or a Blueprint to register in one),
    or by default the relay's own functions."""
    if spec is None:
        return functions.app()
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"--app must be module:attribute, e.g. function_app:app: {spec}")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"--app {spec}: {exc}") from None
    if isinstance(found, func.FunctionApp):
        return found
    if isinstance(found, func.Blueprint):
        app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
        app.register_functions(found)
        return app
    raise ConfigurationError(f"--app {spec} is neither a FunctionApp nor a Blueprint")


@dataclass(frozen=True, slots=True)
class Binding:
    """One indexed function: its name, trigger binding and the function itself."""

    name: str
    trigger: dict[str, Any]
    function: Callable[..., Awaitable[Any]]


def index(app: func.FunctionApp) -> list[Binding]:
    """The app's functions, from one ``get_functions()`` call as the worker makes it."""
    found = []
    for function in app.get_functions():
        bindings = [json.loads(raw) for raw in function.get_raw_bindings()]
        trigger = next(b for b in bindings if b["type"].endswith("Trigger"))
        name = function.get_function_name() or function.get_user_function().__name__
        found.append(Binding(name, trigger, function.get_user_function()))
    return found


class PollWait:
    """How long the listener waits after a receive that found nothing, as the host's queue
    listener does (the WebJobs SDK's ``QueuePollingIntervals.Minimum`` then doubling, without its
    randomisation): ``MIN_POLL_SECONDS`` after a receive that found a message, twice that after
    each further empty one, at most ``maxPollingInterval``. No wait after a message."""

    def __init__(self, maximum: float) -> None:
        self.maximum = maximum
        self._next = min(MIN_POLL_SECONDS, maximum)

    def found(self) -> None:
        self._next = min(MIN_POLL_SECONDS, self.maximum)

    def empty(self) -> float:
        """The wait after this empty receive."""
        wait, self._next = self._next, min(self._next * 2, self.maximum)
        return wait


class QueueListener:
    """Feeds one queue to one queue-triggered function, with the host's retry and poison rules."""

    def __init__(self, binding: Binding, settings: QueueSettings, options: QueueOptions) -> None:
        self.binding = binding
        self.options = options
        queue = resolve(binding.trigger["queueName"])
        # Raw clients: the message is decoded here, as the trigger does, so that a message that
        # is not base64 fails the invocation instead of the receive.
        self.queue = _raw_client(settings, queue)
        self.poison = _raw_client(settings, f"{queue}-poison")

    async def run(self, stopping: asyncio.Event) -> None:
        created = False
        idle = PollWait(self.options.max_polling_interval)
        while not stopping.is_set():
            try:
                if not created:
                    with contextlib.suppress(ResourceExistsError):
                        await self.queue.create_queue()
                    created = True
                handled = await self._receive_one()
            except Exception as exc:  # noqa: BLE001 - like the host: storage errors never stop it
                # A failed delete or retry only makes that message come back (one more drain).
                logger.warning("queue %s: %s", self.queue.queue_name, type(exc).__name__)
                handled = False
            if handled:
                idle.found()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), idle.empty())

    async def close(self) -> None:
        await close_queue_client(self.queue)
        await close_queue_client(self.poison)

    async def _receive_one(self) -> bool:
        messages = self.queue.receive_messages(
            max_messages=1, visibility_timeout=int(self.options.function_timeout)
        )
        stored = await anext(aiter(messages), None)
        if stored is None:
            return False
        await self._invoke(stored)
        return True

    async def _invoke(self, stored: StoredMessage) -> None:
        try:
            body = base64.b64decode(stored.content or "", validate=True)
            message = QueueMessage(  # type: ignore[no-untyped-call]
                id=stored.id,
                body=body,
                dequeue_count=stored.dequeue_count,
                expiration_time=stored.expires_on,
                insertion_time=stored.inserted_on,
                pop_receipt=stored.pop_receipt,
            )
            await self.binding.function(message)
        except Exception as exc:  # noqa: BLE001 - like the host: any failure means "try again"
            await self._failed(stored, exc)
        else:
            await self.queue.delete_message(stored)

    async def _failed(self, stored: StoredMessage, exc: BaseException) -> None:
        logger.error(
            "%s failed on message %s (dequeue %s): %s",
            self.binding.name,
            stored.id,
            stored.dequeue_count,
            type(exc).__name__,
        )
        if (stored.dequeue_count or 0) >= self.options.max_dequeue_count:
            with contextlib.suppress(ResourceExistsError):
                await self.poison.create_queue()
            await self.poison.send_message(stored.content)
            await self.queue.delete_message(stored)
            logger.warning("message %s moved to %s", stored.id, self.poison.queue_name)
        else:
            await self.queue.update_message(
                stored, visibility_timeout=int(self.options.visibility_timeout)
            )


def _raw_client(settings: QueueSettings, queue: str) -> QueueClient:
    return make_queue_client(settings.model_copy(update={"queue_name": queue}), encoded=False)


def failure_redactor(settings: Settings | None = None) -> Redactor:
    """What hides the app's secrets in serve's own failure logs (credential shapes at least)."""
    try:
        return Redactor.from_settings(settings or Settings.load())
    except ConfigurationError:
        return Redactor([])  # the functions themselves will say which setting is wrong


async def run_timer(
    binding: Binding, stopping: asyncio.Event, redact: Redactor | None = None
) -> None:
    """Call a timer-triggered function at each firing of its schedule."""
    redact = redact or Redactor([])
    schedule = Schedule.parse(binding.trigger["schedule"])
    while not stopping.is_set():
        due = schedule.next_after(datetime.now(UTC))
        wait = (due - datetime.now(UTC)).total_seconds()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), max(wait, 0))
            return
        late = datetime.now(UTC) - due > timedelta(seconds=5)
        try:
            await binding.function(TimerRequest(past_due=late))
        except Exception as exc:  # noqa: BLE001 - the next firing tries again
            logger.error("%s failed: %s", binding.name, redact(f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True, slots=True)
class ServeKey:
    """A key serve takes: the name its caller acts under, the key, whether it may act."""

    name: str
    secret: str = field(repr=False)
    can_act: bool = True


class KeyRing:
    """serve's keys: which one a request's key is, compared in constant time with each."""

    def __init__(self, keys: Sequence[ServeKey]) -> None:
        self._keys = [(k, k.secret.encode("utf-8", "surrogatepass")) for k in keys]

    @classmethod
    def of(
        cls, key: str | None, view_key: str | None = None, named: Sequence[ServeKey] = ()
    ) -> KeyRing:
        """``OUTBOX_FUNCTION_KEY`` (``function key``), ``OUTBOX_CONSOLE_VIEW_KEY`` (``view
        key``) and the named keys."""
        single = [
            ServeKey(FUNCTION_KEY_NAME, key, True) if key else None,
            ServeKey(VIEW_KEY_NAME, view_key, False) if view_key else None,
        ]
        return cls([k for k in single if k is not None] + list(named))

    def match(self, given: str) -> ServeKey | None:
        # Header bytes that are not UTF-8 arrive as lone surrogates: compared, never crashed on.
        wanted = given.encode("utf-8", "surrogatepass")
        found = None
        for key, secret in self._keys:  # every one compared: the time says nothing of which
            if hmac.compare_digest(wanted, secret):
                found = key
        return found if given else None


def named_keys(settings: Settings) -> tuple[ServeKey, ...]:
    """``OUTBOX_CONSOLE_KEYS`` (may act) and ``OUTBOX_CONSOLE_VIEW_KEYS`` (only read)."""
    acting = settings.console_keys or {}
    reading = settings.console_view_keys or {}
    return (
        *(ServeKey(n, k.get_secret_value(), True) for n, k in acting.items()),
        *(ServeKey(n, k.get_secret_value(), False) for n, k in reading.items()),
    )


class WrongKeys:
    """The wrong keys each address sent over the last ``window`` seconds: once ``allowed`` of
    them, the address waits until the oldest of those is ``window`` old (``retry_after``)."""

    def __init__(
        self,
        allowed: int = WRONG_KEYS_ALLOWED,
        window: float = WRONG_KEYS_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        remembered: int = WRONG_KEYS_ADDRESSES,
    ) -> None:
        self._allowed, self._window, self._clock = allowed, window, clock
        self._remembered = remembered
        self._seen: dict[str, collections.deque[float]] = {}

    def retry_after(self, address: str) -> float:
        """Seconds ``address`` must wait before its next keyed request (0: none)."""
        times = self._recent(address)
        if len(times) < self._allowed:
            return 0.0
        return max(times[-self._allowed] + self._window - self._clock(), 0.0)

    def failed(self, address: str) -> bool:
        """Count a wrong key from ``address``; whether it has to wait from now on."""
        times = self._recent(address)
        times.append(self._clock())
        self._seen[address] = self._seen.pop(address, times)  # the latest last
        while len(self._seen) > self._remembered:
            del self._seen[next(iter(self._seen))]
        return len(times) >= self._allowed

    def _recent(self, address: str) -> collections.deque[float]:
        times = self._seen.get(address) or collections.deque(maxlen=self._allowed)
        while times and times[0] <= self._clock() - self._window:
            times.popleft()
        return times


def http_app(
    bindings: list[Binding],
    key: str | None,
    redact: Redactor | None = None,
    guard: Guard | None = None,
    view_key: str | None = None,
    named: Sequence[ServeKey] = (),
    wrong_keys: WrongKeys | None = None,
) -> web.Application:
    """``/api/<route>`` for each HTTP-triggered function, with key checks (and the connection
    guard's bookkeeping, when there is one): ``key`` and the acting ones of ``named`` open every
    function, ``view_key`` and the others of ``named`` the functions that only read (GET
    alone); wrong keys are counted by address in ``wrong_keys``."""
    middlewares = [_json_errors] if guard is None else [guard.middleware, _json_errors]
    app = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    checks = _KeyChecks(KeyRing.of(key, view_key, named), wrong_keys or WrongKeys())
    for binding in bindings:
        handler = _http_handler(binding, checks, redact or Redactor([]))
        for method in binding.trigger.get("methods") or ["GET", "POST"]:
            app.router.add_route(method.upper(), f"/api/{binding.trigger['route']}", handler)
    return app


def _json(
    body: Mapping[str, Any], status: int, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(body, status=status, headers={**JSON_HEADERS, **(headers or {})})


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """A route nobody serves (404) or a method it does not take (405): JSON like every answer."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        error = f"no such route: {request.method} {request.path}"
        return _json({"error": error}, 404)
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        error = f"{request.method} is not allowed on {request.path}; use {allowed}"
        return _json({"error": error}, 405, {"Allow": allowed})


@dataclass(frozen=True, slots=True)
class _KeyChecks:
    ring: KeyRing
    wrong: WrongKeys

    def check(self, request: web.Request, *, acts: bool) -> ServeKey | web.Response:
        """The key a request came with, or the answer that refuses it."""
        address = throttled_address(request)
        wait = self.wrong.retry_after(address)
        if wait:
            seconds = str(math.ceil(wait))
            error = f"too many wrong keys from this address: try again in {seconds} s"
            return _json({"error": error}, 429, {"Retry-After": seconds})
        given = request.headers.get("x-functions-key") or request.query.get("code") or ""
        matched = self.ring.match(given)
        if matched is not None and (matched.can_act or not acts):
            return matched
        if matched is not None:
            return _json({"error": "this key may read, not act: use a key that acts"}, 401)
        if given:
            self._wrong(request, address)
        return _json({"error": "a valid function key is required"}, 401)

    def _wrong(self, request: web.Request, address: str) -> None:
        waits = self.wrong.failed(address)
        agent = request.headers.get("User-Agent", "")[:MAX_USER_AGENT_CHARS]
        log_event(
            logger,
            logging.WARNING,
            "outbox.wrong_key",
            address=caller_address(request),
            user_agent=agent or None,
            route=f"{request.method} {request.path}",
            throttled=True if waits else None,
        )


def caller_address(request: web.Request) -> str | None:
    """Where a request says it comes from: the first of ``X-Forwarded-For``, else its peer."""
    return forwarded_for(request.headers.get("X-Forwarded-For")) or request.remote


def throttled_address(request: web.Request) -> str:
    """The address wrong keys are counted by: the peer's, which the caller cannot choose;
    behind a proxy (a peer on a private or loopback network) the address that proxy added last
    to ``X-Forwarded-For``."""
    peer = request.remote or ""
    try:
        local = ipaddress.ip_address(peer).is_private or ipaddress.ip_address(peer).is_loopback
    except ValueError:
        local = False
    hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",") if h.strip()]
    return (forwarded_for(hops[-1]) or peer) if local and hops else peer


def _http_handler(
    binding: Binding, checks: _KeyChecks, redact: Redactor
) -> Callable[[web.Request], Awaitable[web.Response]]:
    needs_key = binding.trigger.get("authLevel", "FUNCTION").upper() != "ANONYMOUS"
    acts = [m.upper() for m in binding.trigger.get("methods") or []] != ["GET"]

    async def handle(request: web.Request) -> web.Response:
        checked = None
        if needs_key:
            found = checks.check(request, acts=acts)
            if isinstance(found, web.Response):
                return found
            checked = CheckedKey(found.name, found.can_act, request.remote)
        token = checked_key.set(checked)
        try:
            return await _invoke(binding, request, redact)
        finally:
            checked_key.reset(token)

    return handle


async def _invoke(binding: Binding, request: web.Request, redact: Redactor) -> web.Response:
    """Call the function with the request as the worker hands it over."""
    body = await request.read()
    invocation = func.HttpRequest(
        method=request.method,
        url=str(request.url),
        headers=dict(request.headers),
        params=dict(request.query),
        route_params=dict(request.match_info),
        body=body,
    )
    try:
        response = await binding.function(invocation)
    except Exception:  # noqa: BLE001 - a 500, and the traceback (redacted) in the log
        logger.error("%s failed: %s", binding.name, redact(traceback.format_exc()))
        return _json({"error": "internal error"}, 500)
    return web.Response(
        body=response.get_body(),
        status=response.status_code,
        headers={k: v for k, v in response.headers.items() if k.lower() != "content-length"},
        content_type=response.mimetype,
    )


def _key_matches(request: web.Request, key: str | None) -> bool:
    given = request.headers.get("x-functions-key") or request.query.get("code") or ""
    # Header bytes that are not UTF-8 arrive as lone surrogates; compare them, never crash on them.
    return key is not None and hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass")
    )


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    host_json: Path | None = None  # ./host.json, else the package's
    key: str | None = None
    app: str | None = None  # module:attribute; the relay's own functions by default
    max_connections: int | None = None  # by default a quarter of the descriptor limit
    view_key: str | None = None  # opens the functions that only read (OUTBOX_CONSOLE_VIEW_KEY)
    keys: tuple[ServeKey, ...] = ()  # OUTBOX_CONSOLE_KEYS and OUTBOX_CONSOLE_VIEW_KEYS


async def start_http(
    bindings: list[Binding], options: ServeOptions, redact: Redactor | None = None
) -> web.AppRunner:
    """The HTTP functions, listening behind the connection guard; a port that cannot be had is
    said plainly."""
    limit = options.max_connections or default_max_connections()

    def connection() -> asyncio.Protocol:
        assert runner.server is not None  # set up before the site starts
        return runner.server()

    guard = Guard(connection, max_connections=limit)
    app = http_app(bindings, options.key, redact, guard, options.view_key, options.keys)
    health.add_routes(app, lambda request: _key_matches(request, options.key))
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=5, keepalive_timeout=KEEPALIVE_TIMEOUT_SECONDS
    )
    await runner.setup()
    try:
        await GuardedSite(runner, options.host, options.port, guard).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigurationError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    return runner


async def serve(
    app: func.FunctionApp,
    options: ServeOptions,
    stopping: asyncio.Event,
    settings: Settings,
) -> None:
    """Run every function of ``app`` until ``stopping`` is set, then shut down gracefully.

    ``settings``: the process's, built once by the caller and handed to the functions' host.
    """
    bindings = index(app)
    queue_options = QueueOptions.from_host_json(host_json_path(options.host_json))
    functions_host.use(settings)
    telemetry_setup.configure(prometheus=True)
    queued = [b for b in bindings if b.trigger["type"] == "queueTrigger"]
    if queued and not settings.has_queue:
        if not settings.wakes_by_postgres:
            logger.warning(
                "no wake-up queue configured (AzureWebJobsStorage) and OUTBOX_WAKEUP is not "
                "postgres: %s not served; new messages wait for the five-minute sweep or an "
                "HTTP drain (retries are timed in-process all the same)",
                ", ".join(b.name for b in queued),
            )
        queued = []
    listeners = [QueueListener(b, settings, queue_options) for b in queued]
    http = [b for b in bindings if b.trigger["type"] == "httpTrigger"]
    redact = failure_redactor(settings)
    AcceptErrors.install(Throttled(logger, ACCEPT_ERROR_LOG_INTERVAL_SECONDS))
    runner = await start_http(http, options, redact)
    logger.info(
        "serving %d functions; HTTP on http://%s:%d/api/ (%s; at most %d connections; "
        "event loop %s); at most %d webhook requests at once (OUTBOX_CONCURRENCY)",
        len(bindings),
        options.host,
        options.port,
        "function key required"
        if options.key or options.keys
        else "no OUTBOX_FUNCTION_KEY: keyed routes answer 401",
        options.max_connections or default_max_connections(),
        type(asyncio.get_running_loop()).__module__.split(".")[0],
        settings.concurrency,
    )
    tasks = [asyncio.create_task(listener.run(stopping)) for listener in listeners]
    # What waited while no relay ran is taken now, not at the first hint or sweep.
    tasks.append(asyncio.create_task(_drain_at_startup(redact)))
    # Retries on time whatever the queue does; and, over PostgreSQL, a drain at each NOTIFY.
    drainer = Drainer(redact)
    tasks.append(asyncio.create_task(drainer.run(stopping)))
    if settings.wakes_by_postgres:
        notified = PostgresListener(settings.database_url.get_secret_value(), drainer)
        tasks.append(asyncio.create_task(notified.run(stopping)))
        tasks.append(asyncio.create_task(watch_notify_queue(stopping)))
    tasks += [
        asyncio.create_task(run_timer(b, stopping, redact))
        for b in bindings
        if b.trigger["type"] == "timerTrigger"
    ]
    try:
        await stopping.wait()
    finally:
        logger.info("stopping: finishing in-flight deliveries")
        functions_host.stop()
        await runner.cleanup()
        await asyncio.gather(*tasks, return_exceptions=True)
        for listener in listeners:
            await listener.close()
        await functions_host.close()
        logger.info("stopped")


async def _drain_at_startup(redact: Redactor) -> None:
    try:
        await triggers.on_startup()
    except Exception as exc:  # noqa: BLE001 - like a timer's failure: logged, the rest serves on
        logger.error("start-up drain failed: %s", redact(describe(exc)))


async def watch_notify_queue(stopping: asyncio.Event) -> None:
    """Read PostgreSQL's NOTIFY queue usage every ``NOTIFY_QUEUE_CHECK_SECONDS``
    (``OUTBOX_WAKEUP=postgres``): it feeds the gauge ``outbox.wakeup.notify_queue_usage`` and
    tells the relay's wake-ups whether to poll. A reading the database does not answer is
    skipped (the listener and the drains say so already): the last one stands."""
    relay = await functions_host.relay()
    observed = telemetry.process_telemetry()
    while not stopping.is_set():
        with contextlib.suppress(DatabaseError):
            usage = await notify_queue_usage(relay.pool)
            observed.record_notify_queue_usage(usage)
            relay.wakeups.notify_queue_read(usage, time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), NOTIFY_QUEUE_CHECK_SECONDS)


def install_stop_signals(stopping: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)


async def main(options: ServeOptions, settings: Settings) -> None:
    app = load_app(options.app)
    stopping = asyncio.Event()
    install_stop_signals(stopping)
    await serve(app, options, stopping, settings)
