"""The wake-up hint from synchronous code: the hint of ``outbox.wakeup``, sent with the
synchronous queue client and no event loop (``outbox.sync.notify``).

The send runs in a short-lived daemon thread that the caller waits for at most
``NOTIFY_TIMEOUT_SECONDS``, the bound the async ``notify`` keeps with ``asyncio.timeout``: the
synchronous client has per-request timeouts only, and a retry or the first hint's queue creation
would add theirs up. A send still running then finishes (or times out) in its thread, unwaited.
"""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType
from typing import Self

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from outbox.core.errors import ConfigurationError
from outbox.core.redact import Redactor
from outbox.core.settings import QueueSettings
from outbox.transport import wakeup


def make_sync_queue_client(settings: QueueSettings) -> QueueClient:
    """A synchronous client for the wake-up queue, from a connection string or an identity."""
    if settings.queue_connection is not None:
        try:
            return QueueClient.from_connection_string(
                settings.queue_connection.get_secret_value(),
                settings.queue_name,
                **wakeup.CLIENT_OPTIONS,
            )
        except ValueError:  # its message never quotes the string, which holds the key
            raise ConfigurationError(wakeup.BAD_CONNECTION_STRING) from None
    account_url = wakeup.queue_account_url(settings)
    try:
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415 - optional extra
    except ImportError:
        raise ConfigurationError(wakeup.NEEDS_IDENTITY) from None
    return QueueClient(
        account_url,
        settings.queue_name,
        credential=DefaultAzureCredential(),
        **wakeup.CLIENT_OPTIONS,
    )


def notify_once(settings: QueueSettings | None = None) -> bool:
    """Send one hint through a client made for it, from ``settings`` or else the environment.

    Never raises, a misconfigured queue included: it logs a warning and returns False.
    """
    try:
        temporary = WakeUpQueue.from_settings(settings)
    except Exception as exc:  # noqa: BLE001 - a misconfigured hint must not fail the caller either
        wakeup.WakeUpQueue.log_not_sent(exc)
        return False
    with temporary:
        return temporary.notify()


class WakeUpQueue:
    """Sends hints to the wake-up queue from synchronous code; reuse one per process (it holds
    an HTTP session). ``with`` closes it, as ``close()`` does."""

    def __init__(
        self, client: QueueClient, *, redact: Redactor | None = None, owns_credential: bool = False
    ) -> None:
        self.client = client
        self._redact = redact or Redactor([])
        self._owns_credential = owns_credential

    @classmethod
    def from_settings(cls, settings: QueueSettings | None = None) -> Self:
        settings = settings or QueueSettings.load()
        client = make_sync_queue_client(settings)
        return cls(client, redact=wakeup.queue_redactor(settings), owns_credential=True)

    def notify(self) -> bool:
        """Send one hint. Never raises: on failure, or without an answer within
        ``NOTIFY_TIMEOUT_SECONDS``, it logs one warning and returns False.

        The outbox row is already committed, so a lost hint only delays delivery until the
        next timer sweep.
        """
        outcome: list[BaseException | None] = []
        sender = threading.Thread(
            target=self._send_into, args=(outcome,), name="outbox-wake-up-hint", daemon=True
        )
        sender.start()
        sender.join(wakeup.NOTIFY_TIMEOUT_SECONDS)
        seconds = wakeup.NOTIFY_TIMEOUT_SECONDS
        error = outcome[0] if outcome else TimeoutError(f"no answer in {seconds:g} s")
        if error is not None:
            wakeup.WakeUpQueue.log_not_sent(error, self._redact)
            return False
        return True

    def _send_into(self, outcome: list[BaseException | None]) -> None:
        try:
            self._send()
        except Exception as exc:  # noqa: BLE001 - reported by notify(), which never raises
            outcome.append(exc)
        else:
            outcome.append(None)

    def _send(self) -> None:
        try:
            self.client.send_message(wakeup.hint_message())
        except ResourceNotFoundError:
            # First hint on a new storage account: create the queue, then send again.
            with contextlib.suppress(ResourceExistsError):
                self.client.create_queue()
            self.client.send_message(wakeup.hint_message())

    def close(self) -> None:
        """Close the client, and the identity credential ``from_settings`` made for it."""
        credential = getattr(self.client, "credential", None) if self._owns_credential else None
        self.client.close()
        close = getattr(credential, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
