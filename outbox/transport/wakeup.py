"""The wake-up queue: tiny base64 JSON hints that tell a relay "rows are waiting".

The async client (``WakeUpQueue``), and what the synchronous one (``sync_wakeup``) shares with it:
the hint, the client's options, ``build_client`` and ``HintClient``; each keeps its own I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, NamedTuple, Self, TypeVar, cast

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import TextBase64DecodePolicy, TextBase64EncodePolicy
from azure.storage.queue.aio import QueueClient

from outbox.core.errors import ConfigurationError
from outbox.core.redact import Redactor
from outbox.core.resources import Closeable
from outbox.core.settings import QueueSettings

logger = logging.getLogger("outbox.wakeup")

# A hint is worth little after a few seconds; the business request that sent it must not wait long.
NOTIFY_TIMEOUT_SECONDS = 5.0
# Hints asked for while one is on its way wait for its answer to go out together, but no longer
# than this: a slow answer must not hold every caller behind it.
ROUND_PATIENCE_SECONDS = 0.5
# The longest an Azure Storage queue keeps a message invisible after it is sent: seven days.
MAX_DELAY_SECONDS = 7 * 24 * 3600
CLIENT_OPTIONS: dict[str, Any] = {
    # Base64, like the queue trigger expects by default: plain text would end in the poison queue.
    "message_encode_policy": TextBase64EncodePolicy(),
    "message_decode_policy": TextBase64DecodePolicy(),
    # One quick retry, not the SDK's default of three after 15 s or more.
    "retry_total": 1,
    "initial_backoff": 0.5,
    "increment_base": 0,
    "random_jitter_range": 0.25,
    "connection_timeout": 3,
    "read_timeout": 5,
}
_RAW: dict[str, Any] = {"message_encode_policy": None, "message_decode_policy": None}
# What a misconfigured queue connection is called (by both clients, the async and the sync one).
BAD_CONNECTION_STRING = "AzureWebJobsStorage is not a valid storage connection string"
NEEDS_IDENTITY = (
    "an identity-based AzureWebJobsStorage connection needs the azure-identity package "
    "(pip install azure-identity)"
)

Client = TypeVar("Client")


class Waiting(NamedTuple):
    """The last hint a client sent, while no relay may have taken it: a relay's receive gives it
    a new pop receipt, and then an update with this one fails."""

    id: str
    pop_receipt: str

    @classmethod
    def of(cls, message_id: str | None, pop_receipt: str | None) -> Waiting | None:
        return cls(message_id, pop_receipt) if message_id and pop_receipt else None


def hint_message(delay_seconds: int = 0) -> str:
    """The hint's content: when it was sent (and, delayed, when it is meant to wake a relay),
    nothing about the business data."""
    sent = datetime.now(UTC)
    content = {"requestedAt": sent.isoformat()}
    if delay_seconds:
        content["wakeAt"] = (sent + timedelta(seconds=delay_seconds)).isoformat()
    return json.dumps(content)


def queue_account_url(settings: QueueSettings) -> str:
    """The queue service of an identity-based connection; ConfigurationError if none is set."""
    account_url = settings.queue_service_uri or (
        f"https://{settings.queue_account_name}.queue.core.windows.net"
        if settings.queue_account_name
        else None
    )
    if account_url is None:
        raise ConfigurationError(
            "no wake-up queue configured: set AzureWebJobsStorage (a connection string) or "
            "AzureWebJobsStorage__queueServiceUri / AzureWebJobsStorage__accountName (identity)"
        )
    return account_url


def queue_redactor(settings: QueueSettings) -> Redactor:
    """What a hint client's errors must never show: the queue's connection string."""
    connection = settings.queue_connection
    return Redactor([connection.get_secret_value()] if connection else [])


def build_client(
    settings: QueueSettings, kind: type[Client], identity: str, options: dict[str, Any]
) -> Client:
    """A ``kind`` of SDK queue client (the async or the sync ``QueueClient``) for the wake-up
    queue, from a connection string, or a managed identity (``DefaultAzureCredential`` of the
    ``identity`` module, an optional extra)."""
    sdk: Any = kind
    if settings.queue_connection is not None:
        secret = settings.queue_connection.get_secret_value()
        try:
            return cast(Client, sdk.from_connection_string(secret, settings.queue_name, **options))
        except ValueError:  # its message never quotes the string, which holds the key
            raise ConfigurationError(BAD_CONNECTION_STRING) from None
    account_url = queue_account_url(settings)
    try:
        module = importlib.import_module(identity)
    except ImportError:
        raise ConfigurationError(NEEDS_IDENTITY) from None
    credential = queue_credential(settings, module)
    return cast(Client, sdk(account_url, settings.queue_name, credential=credential, **options))


def queue_credential(settings: QueueSettings, identity: Any) -> Any:
    """The identity's credential, chosen as the Functions host chooses it: with
    ``AzureWebJobsStorage__credential=managedidentity`` a ``ManagedIdentityCredential`` (of
    ``AzureWebJobsStorage__clientId``'s user-assigned identity, if set), else
    ``DefaultAzureCredential``."""
    if settings.queue_credential is not None:  # managedidentity: the only value accepted
        if settings.queue_client_id:
            return identity.ManagedIdentityCredential(client_id=settings.queue_client_id)
        return identity.ManagedIdentityCredential()
    return identity.DefaultAzureCredential()


class HintClient(Generic[Client]):
    """A wake-up queue client's state: the SDK client, what its errors must never show, and
    whether it closes the client's credential (``from_settings`` makes an identity's)."""

    def __init__(
        self, client: Client, *, redact: Redactor | None = None, owns_credential: bool = False
    ) -> None:
        self.client = client
        self._redact = redact or Redactor([])
        self._owns_credential = owns_credential
        # Whether the last hint sent, while still waiting, is refreshed rather than repeated: not
        # once the queue refused an update (403: a *Storage Queue Data Message Sender* identity
        # or a SAS may add messages, not update them).
        self.refreshes = True
        self._rounds_begin()

    def _rounds_begin(self) -> None:
        """Set up what the client's rounds of hints keep (each kind keeps its own)."""

    @classmethod
    def client_for(cls, settings: QueueSettings) -> Client:
        raise NotImplementedError

    @classmethod
    def from_settings(cls, settings: QueueSettings | None = None) -> Self:
        settings = settings or QueueSettings.load()
        return cls(cls.client_for(settings), redact=queue_redactor(settings), owns_credential=True)

    @classmethod
    def for_one_hint(cls, settings: QueueSettings | None) -> Self | None:
        """A client for one hint (``notify_once``), from ``settings`` or else the environment;
        None, with the warning logged, when they make none (a misconfigured queue)."""
        try:
            return cls.from_settings(settings)
        except Exception as exc:  # noqa: BLE001 - a misconfigured hint must not fail the caller
            cls.log_not_sent(exc)
            return None

    def _waiting_hint(self, message_id: str | None, pop_receipt: str | None) -> Waiting | None:
        """What to refresh next time, after a hint was sent or refreshed: nothing where this
        client may not update hints."""
        return Waiting.of(message_id, pop_receipt) if self.refreshes else None

    def _refresh_refused(self, exc: HttpResponseError) -> None:
        """The queue refused to refresh the waiting hint: it was taken by a relay (another pop
        receipt), deleted or expired, and a new one is sent; on a 403, this client may only add
        hints, and from now on sends one each round, as before refreshing existed."""
        if exc.status_code == 403 and self.refreshes:
            self.refreshes = False
            logger.info(
                "wake-up hints: this client may send hints but not update them (%s), so each "
                "round sends one; docs/producer.md says which role lets a waiting hint be "
                "refreshed",
                self._redact(str(getattr(exc, "error_code", None) or exc.status_code)),
            )

    @staticmethod
    def log_not_sent(exc: BaseException, redact: Redactor | None = None) -> None:
        """The one warning a lost hint produces (without any credential in it)."""
        logger.warning(
            "outbox wake-up hint not sent (the row is safe; the timer sweep will deliver it): %s",
            (redact or Redactor([]))(f"{type(exc).__name__}: {exc}"),
        )


def make_queue_client(settings: QueueSettings, *, encoded: bool = True) -> QueueClient:
    """An async client for the wake-up queue, from a connection string or a managed identity.

    ``encoded=False`` gives a client that sends and receives message text as it is.
    """
    options = CLIENT_OPTIONS if encoded else {**CLIENT_OPTIONS, **_RAW}
    return build_client(settings, QueueClient, "azure.identity.aio", options)


async def close_queue_client(client: QueueClient, *, with_credential: bool = True) -> None:
    """Close a client from ``make_queue_client``, and the identity credential it made for it.

    Closing a client does not close its credential; an unclosed ``DefaultAzureCredential``
    keeps an HTTP session (and its sockets) open.
    """
    credential = getattr(client, "credential", None) if with_credential else None
    await client.close()
    close = getattr(credential, "close", None)
    if close is not None and asyncio.iscoroutinefunction(close):
        await close()


async def notify_once(settings: QueueSettings | None = None) -> bool:
    """Send one hint through a client made for it, from ``settings`` or else the environment.

    Never raises, a misconfigured queue included: it logs a warning and returns False.
    """
    temporary = WakeUpQueue.for_one_hint(settings)
    if temporary is None:
        return False
    async with temporary:
        return await temporary.notify()


class WakeUpQueue(HintClient[QueueClient], Closeable):
    """Sends hints to the wake-up queue; reuse one per process (it holds an HTTP session).

    Hints asked for while one is on its way go out together, as one message, once it has been
    answered (or has been out for ``ROUND_PATIENCE_SECONDS``): each caller still gets a hint sent
    after it asked (so after its commit), and a busy producer sends about one per round trip to
    the queue rather than one per transaction (each is a storage transaction and, for the queue
    trigger, an invocation).

    And while the last hint it sent is still waiting in the queue (no relay has taken it), the
    next one refreshes it (an update of its content) instead of adding another: the run it wakes
    begins after the refresh, so after the caller's commit. The queue then holds about one hint
    per producer process, not one per transaction, and the queue trigger scales on its length.
    """

    def _rounds_begin(self) -> None:
        # The callers waiting for the next send; done once the latest send is answered; the
        # rounds under way; the last immediate hint sent, while it may still be waiting.
        self._next: asyncio.Future[BaseException | None] | None = None
        self._last: asyncio.Future[None] | None = None
        self._rounds: set[asyncio.Task[None]] = set()
        self._waiting: Waiting | None = None

    @classmethod
    def client_for(cls, settings: QueueSettings) -> QueueClient:
        return make_queue_client(settings)

    async def notify(self, *, delay_seconds: int = 0) -> bool:
        """Send a hint (invisible for ``delay_seconds``, at most seven days), at the latest within
        ``NOTIFY_TIMEOUT_SECONDS``. Never raises: on failure it logs a warning and returns False.

        The outbox row is already committed, so a lost hint only delays delivery until the
        next timer sweep. Immediate hints share a send with those asked for at the same time.
        """
        if delay_seconds > 0:
            error = await self._send_timed(min(delay_seconds, MAX_DELAY_SECONDS))
        else:
            try:
                error = await asyncio.wait_for(
                    asyncio.shield(self._join_next_round()), NOTIFY_TIMEOUT_SECONDS
                )
            except TimeoutError:
                error = TimeoutError(f"no answer in {NOTIFY_TIMEOUT_SECONDS:g} s")
        if error is not None:
            self.log_not_sent(error, self._redact)
        return error is None

    def _join_next_round(self) -> asyncio.Future[BaseException | None]:
        """The future of the next send, which starts once the one on its way (if any) is
        answered or has been out for ``ROUND_PATIENCE_SECONDS``."""
        loop = asyncio.get_running_loop()
        if self._next is None or self._next.get_loop() is not loop:
            self._next = loop.create_future()
            task = loop.create_task(self._send_round(self._next), name="outbox-wake-up-hint")
            self._rounds.add(task)
            task.add_done_callback(self._rounds.discard)
        return self._next

    async def _send_round(self, waiting: asyncio.Future[BaseException | None]) -> None:
        loop = asyncio.get_running_loop()
        before = self._last
        if before is not None and not before.done() and before.get_loop() is loop:
            await asyncio.wait({before}, timeout=ROUND_PATIENCE_SECONDS)
        if self._next is waiting:
            self._next = None  # from now on, callers wait for the round after this one
        self._last = answered = loop.create_future()
        try:
            waiting.set_result(await self._send_timed(0))
        finally:
            answered.set_result(None)

    async def _send_timed(self, delay_seconds: int) -> BaseException | None:
        """One hint sent within ``NOTIFY_TIMEOUT_SECONDS``; the error that stopped it, if any."""
        try:
            async with asyncio.timeout(NOTIFY_TIMEOUT_SECONDS):
                await self._send(delay_seconds)
        except Exception as exc:  # noqa: BLE001 - a hint must never fail the caller
            return exc
        return None

    async def _send(self, delay_seconds: int) -> None:
        if delay_seconds:
            await self._put(delay_seconds)
            return
        # Taken for this send: a round overlapping it finds none and sends a hint of its own.
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            try:
                refreshed = await self.client.update_message(
                    waiting.id, waiting.pop_receipt, content=hint_message(), visibility_timeout=0
                )
            except HttpResponseError as exc:
                self._refresh_refused(exc)
            else:
                self._waiting = self._waiting_hint(waiting.id, refreshed.pop_receipt)
                return
        sent = await self._put(0)
        self._waiting = self._waiting_hint(sent.id, sent.pop_receipt)

    async def _put(self, delay_seconds: int) -> Any:
        visibility = {"visibility_timeout": delay_seconds} if delay_seconds else {}
        try:
            return await self.client.send_message(hint_message(delay_seconds), **visibility)
        except ResourceNotFoundError:
            # First hint on a new storage account: create the queue, then send again.
            with contextlib.suppress(ResourceExistsError):
                await self.client.create_queue()
            return await self.client.send_message(hint_message(delay_seconds), **visibility)

    async def close(self) -> None:
        """Close the client once the hints asked for are sent (or have failed)."""
        running = asyncio.get_running_loop()
        rounds = {task for task in self._rounds if task.get_loop() is running}
        if rounds:
            await asyncio.wait(rounds, timeout=NOTIFY_TIMEOUT_SECONDS + ROUND_PATIENCE_SECONDS)
        await close_queue_client(self.client, with_credential=self._owns_credential)
