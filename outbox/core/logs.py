"""Structured log lines: ``event key=value …`` for people, the same fields in ``extra`` for tools.

Plain ``logging``, so the Functions host (and Application Insights) takes them as they are; the
fields arrive as ``outbox_<name>`` attributes on the record (custom dimensions with OpenTelemetry).
Callers never pass secrets: ids, types, counts, statuses and already-redacted errors only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from outbox.core.telemetry import trace_ids
from outbox.core.text import escape_controls


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log ``event`` with ``fields`` (None values are left out), and the ids of the active span
    (``trace_id``, ``span_id``) where there is one and ``fields`` has none."""
    if not logger.isEnabledFor(level):
        return
    if "trace_id" not in fields:
        fields.update(trace_fields(trace_ids()))
    present = {key: value for key, value in fields.items() if value is not None}
    text = " ".join(f"{key}={_format(value)}" for key, value in present.items())
    extra = {f"outbox_{key}": value for key, value in present.items()}
    logger.log(level, "%s %s", event, text, extra={"outbox_event": event, **extra})


def trace_fields(ids: tuple[str, str] | None) -> dict[str, str]:
    """``trace_id`` and ``span_id`` fields for a span's (trace id, span id); none without one."""
    return {"trace_id": ids[0], "span_id": ids[1]} if ids else {}


def _format(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    # An event type or a receiver's error may hold a newline and a line of its own: escaped.
    return escape_controls(text)


class Throttled:
    """A log line said at most once per ``interval`` seconds: the first occurrence at once, then
    one line per interval with how many occurred since the last line said.

    For errors that can come thousands of times a second (a full descriptor table, a listening
    socket that cannot accept): the log stays readable and small whatever their rate."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float,
        *,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._level = level
        self._clock = clock
        self._said_at: float | None = None
        self._unsaid = 0

    def __call__(self, text: str) -> bool:
        """Log ``text`` (and the count of those left unsaid) unless a line was said less than an
        interval ago; whether it was said."""
        now = self._clock()
        said_at = self._said_at
        if said_at is not None and now - said_at < self._interval:
            self._unsaid += 1
            return False
        if said_at is not None and self._unsaid:
            text = f"{text} (and {self._unsaid} more in the last {now - said_at:.0f}s)"
        self._logger.log(self._level, "%s", escape_controls(text))
        self._said_at, self._unsaid = now, 0
        return True
