"""The relay's exceptions: one base class, each subclass says what went wrong and what to do."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error the relay raises on purpose."""


class ConfigurationError(OutboxError):
    """A setting is missing or invalid. The message names the setting, never its secret value."""


class InvalidMessageError(OutboxError, ValueError):
    """An event cannot be enqueued: bad event type, or a payload that is not a JSON object,
    not serialisable, or too large. Raised before anything is written."""


class TransactionRequiredError(OutboxError):
    """``enqueue`` was called outside a transaction, where it could not be atomic with your rows."""


class DuplicateMessageError(OutboxError):
    """``enqueue`` was given a message id that already exists in ``outbox_messages``."""


class OutdatedSchemaError(OutboxError):
    """``enqueue`` met an outbox schema older than the package: a column or table it writes is
    missing. Run ``python -m outbox migrate`` before deploying a newer package's producers. The
    caller's transaction is aborted, as after any failed statement."""


class InvalidSignature(OutboxError):
    """A webhook request failed ``outbox.inbox.verify``: a header missing or malformed, a timestamp
    outside the tolerance, no signature that matches, or a body that is not a webhook event. The
    message says which, never with a secret or a signature in it; answer such a request 4xx."""


class MigrationError(OutboxError):
    """The migrations on disk disagree with the ones recorded in the database."""


class BadRequestError(OutboxError, ValueError):
    """An operation (HTTP endpoint or command) was asked for with arguments it does not accept;
    the message says which, in the words of the front end that was called."""


class NotFoundError(OutboxError, LookupError):
    """An operation named a message or an endpoint that does not exist; the message names it (the
    HTTP API answers 404, a command exits 1)."""


class ConflictError(OutboxError):
    """An operation cannot be done in the state things are in (a probe of an endpoint whose
    breaker is not open); the message says why (the HTTP API answers 409, a command exits 1)."""


class DatabaseError(OutboxError):
    """The database could not be reached, lost the connection, or refused a statement.

    Raised by ``outbox.store`` for every driver error, so no other module needs the driver's
    exception classes. ``transient``: a new connection may well succeed (unreachable, connection
    lost, server shutting down or out of resources); the message is the driver's error as
    ``Type: message``, which may name hosts, so callers redact it before showing it.
    """

    def __init__(self, message: str, *, transient: bool, kind: str) -> None:
        super().__init__(message)
        self.transient = transient
        self.kind = kind  # the driver's exception class, e.g. ConnectionRefusedError


class EntraTokenError(OutboxError):
    """No Microsoft Entra access token for PostgreSQL could be had (``OUTBOX_DATABASE_AUTH=entra``).

    Its message is one line naming the credential and the cause, never a token. At the store's
    boundary it becomes a transient ``DatabaseError``: the identity endpoint may come back.
    """


class DrainFailedError(OutboxError):
    """A scheduled drain hit a database error (raised so the invocation shows as failed)."""


# What an exception that carries no message of its own means, where the relay meets it.
_SILENT = {
    TimeoutError: "no answer in time (the database or peer is overloaded, locked or unreachable)",
}


def describe(exc: BaseException) -> str:
    """``ExceptionType: message``, never with an empty message (``str(TimeoutError())`` is '')."""
    text = str(exc).strip()
    if not text:
        text = next(
            (meaning for kind, meaning in _SILENT.items() if isinstance(exc, kind)), "(no message)"
        )
    return f"{type(exc).__name__}: {text}"
