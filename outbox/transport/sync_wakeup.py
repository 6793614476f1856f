"""The wake-up hint from synchronous code: the hint of ``outbox.wakeup``, sent with the
synchronous queue client and no event loop (``outbox.sync.notify``).

The send runs in a daemon thread that the caller waits for at most
``NOTIFY_TIMEOUT_SECONDS``, the bound the async ``notify`` keeps with ``asyncio.timeout``: the
synchronous client has per-request timeouts only, and a retry or the first hint's queue creation
would add theirs up. A send still running then finishes (or times out) in its thread, unwaited.
"""

from __future__ import annotations

import contextlib
import os
import threading
from types import TracebackType
from typing import Any, Self, cast

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from outbox.core.settings import QueueSettings
from outbox.transport import wakeup


def make_sync_queue_client(settings: QueueSettings) -> QueueClient:
    """A synchronous client for the wake-up queue, from a connection string or an identity."""
    return wakeup.build_client(settings, QueueClient, "azure.identity", wakeup.CLIENT_OPTIONS)


def notify_once(settings: QueueSettings | None = None) -> bool:
    """Send one hint through a client made for it, from ``settings`` or else the environment.

    Never raises, a misconfigured queue included: it logs a warning and returns False.
    """
    temporary = WakeUpQueue.for_one_hint(settings)
    if temporary is None:
        return False
    with temporary:
        return temporary.notify()


class _Round:
    """The callers of one send: set once it is answered, with the error that stopped it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


class WakeUpQueue(wakeup.HintClient[QueueClient]):
    """Sends hints to the wake-up queue from synchronous code; reuse one per process (it holds
    an HTTP session). ``with`` closes it, as ``close()`` does. Its last hint, while still
    waiting in the queue, is refreshed rather than repeated, as the async client's."""

    def _rounds_begin(self) -> None:
        # The callers waiting for the next send (and the process that made the round: a forked
        # child has no thread for its parent's), and the latest send's answer.
        self._lock = threading.Lock()
        self._next: _Round | None = None
        self._next_pid = 0
        self._last: threading.Event | None = None
        self._waiting: wakeup.Waiting | None = None

    @classmethod
    def client_for(cls, settings: QueueSettings) -> QueueClient:
        return make_sync_queue_client(settings)

    def notify(self) -> bool:
        """Send a hint. Never raises: on failure, or without an answer within
        ``NOTIFY_TIMEOUT_SECONDS``, it logs one warning and returns False.

        The outbox row is already committed, so a lost hint only delays delivery until the
        next timer sweep. Hints asked for from several threads while one is on its way go out
        together, as one message, once it has been answered (as the async client's do).
        """
        with self._lock:
            fresh = self._next is None or self._next_pid != os.getpid()
            if fresh:
                self._next, self._next_pid = _Round(), os.getpid()
            joined = cast(_Round, self._next)
        if fresh:
            sender = threading.Thread(
                target=self._send_round, args=(joined,), name="outbox-wake-up-hint", daemon=True
            )
            try:
                sender.start()
            except RuntimeError as exc:  # no thread to be had: this round is lost, not the next
                with self._lock:
                    if self._next is joined:
                        self._next = None
                joined.error = exc
                joined.done.set()
        seconds = wakeup.NOTIFY_TIMEOUT_SECONDS
        if joined.done.wait(seconds):
            error = joined.error
        else:
            error = TimeoutError(f"no answer in {seconds:g} s")
        if error is not None:
            self.log_not_sent(error, self._redact)
        return error is None

    def _send_round(self, waiting: _Round) -> None:
        with self._lock:
            before = self._last
        if before is not None:
            before.wait(wakeup.ROUND_PATIENCE_SECONDS)
        with self._lock:
            if self._next is waiting:
                self._next = None  # from now on, callers wait for the round after this one
            self._last = answered = threading.Event()
        try:
            self._send()
        except Exception as exc:  # noqa: BLE001 - reported by notify(), which never raises
            waiting.error = exc
        finally:
            answered.set()
            waiting.done.set()

    def _send(self) -> None:
        with self._lock:  # taken for this send: an overlapping round sends a hint of its own
            waiting, self._waiting = self._waiting, None
        if waiting is not None:
            try:
                refreshed = self.client.update_message(
                    waiting.id,
                    waiting.pop_receipt,
                    content=wakeup.hint_message(),
                    visibility_timeout=0,
                )
            except HttpResponseError as exc:
                self._refresh_refused(exc)
            else:
                with self._lock:
                    self._waiting = self._waiting_hint(waiting.id, refreshed.pop_receipt)
                return
        sent = self._put()
        with self._lock:
            self._waiting = self._waiting_hint(sent.id, sent.pop_receipt)

    def _put(self) -> Any:
        try:
            return self.client.send_message(wakeup.hint_message())
        except ResourceNotFoundError:
            # First hint on a new storage account: create the queue, then send again.
            with contextlib.suppress(ResourceExistsError):
                self.client.create_queue()
            return self.client.send_message(wakeup.hint_message())

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
