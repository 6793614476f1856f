"""Classify: what each delivery's attempt comes to, and each message's outcome from its deliveries.

The rules themselves are pure and live in ``outbox.core.outcomes`` (``classify``, ``aggregate``);
this part applies them to a batch: an attempt that did not return (never sent, interrupted, or an
exception nobody foresaw) becomes a result first, its text redacted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from outbox.core.models import (
    Attempt,
    Delivered,
    DeliveryResult,
    NotAttempted,
    Outcome,
    Recorded,
    Status,
    TransportError,
    Undeliverable,
)
from outbox.core.outcomes import aggregate, classify
from outbox.core.redact import Redactor
from outbox.core.settings import WebhookEndpoint
from outbox.relay.batch import Batch, Delivery, endpoint_name, endpoint_names

NOT_SENT = "run interrupted before this message was sent"


class Classifier:
    """A batch's attempts as outcomes: per delivery, and per message (``Recorded``)."""

    def __init__(
        self,
        max_attempts: int,
        endpoints: Mapping[str, Sequence[WebhookEndpoint]],
        redact: Redactor,
    ) -> None:
        self._max_attempts = max_attempts
        self._endpoints = endpoints
        self._redact = redact

    def outcome(self, batch: Batch, index: int, now: datetime) -> Recorded:
        """The outcome of the batch's message ``index``, folded from its deliveries."""
        message, planned = batch.messages[index], batch.deliveries[index]
        if isinstance(planned, Undeliverable):
            attempt = Attempt(planned, now.timestamp(), 0)
            outcome = self.classify(attempt, 1, (), now)
            return Recorded(message, outcome, (Delivered(None, message.attempt, attempt, outcome),))
        delivered = tuple(self._delivered(delivery, now) for delivery in planned)
        names = endpoint_names(self._endpoints, message.event_type)
        outcome, state = aggregate(message, delivered, names)
        return Recorded(message, outcome, delivered, state)

    def _delivered(self, delivery: Delivery, now: datetime) -> Delivered:
        attempt = delivery.attempt
        if not isinstance(attempt, Attempt):
            attempt = self._broken_attempt(attempt, delivery.started, now)
        final = delivery.endpoint.final_statuses
        try:
            outcome = self.classify(attempt, delivery.number, final, now)
        except Exception as exc:  # noqa: BLE001 - an answer nobody foresaw must not cost the batch
            attempt = attempt._replace(result=self.unexpected(exc))
            outcome = self.classify(attempt, delivery.number, final, now)
        return Delivered(endpoint_name(delivery.endpoint), delivery.number, attempt, outcome)

    def classify(
        self, attempt: Attempt, number: int, final_statuses: Sequence[int], now: datetime
    ) -> Outcome:
        return classify(
            attempt.result,
            attempt=number,
            max_attempts=self._max_attempts,
            now=now,
            final_statuses=final_statuses,
        )

    def label(self, result: DeliveryResult, delivery: Delivery, now: datetime) -> str:
        """What ``result`` comes to for its endpoint (Processed, Pending, Failed), for telemetry;
        the outcome written is decided with the batch's (``outcome``)."""
        attempt = Attempt(result, time.time(), 0)
        try:
            outcome = self.classify(attempt, delivery.number, delivery.endpoint.final_statuses, now)
        except Exception:  # noqa: BLE001 - recorded as retried, as _delivered does
            return str(Status.PENDING)
        return str(outcome.status)

    def unexpected(self, error: BaseException) -> TransportError:
        """An exception as a retryable result, its text redacted."""
        name = type(error).__name__
        return TransportError(self._redact(f"unexpected {name}: {error}"), name)

    def _broken_attempt(
        self, error: BaseException | None, started: tuple[float, float] | None, now: datetime
    ) -> Attempt:
        """An attempt that did not return: never sent, interrupted, or failed unexpectedly."""
        if error is not None:
            result: DeliveryResult = self.unexpected(error)
        elif started is None:
            # Never sent (the run was cancelled first): given back as it was, not counted.
            return Attempt(NotAttempted(NOT_SENT), now.timestamp(), 0)
        else:
            # The request may have reached the receiver: count the attempt and retry later.
            result = TransportError("delivery interrupted before it completed", "Interrupted")
        if started is None:
            return Attempt(result, now.timestamp(), 0)
        return Attempt(result, started[0], round((time.monotonic() - started[1]) * 1000))
