"""Structured log lines: ``event key=value …`` for people, the same fields in ``extra`` for tools.

Plain ``logging``, so the Functions host (and Application Insights) takes them as they are; the
fields arrive as ``outbox_<name>`` attributes on the record (custom dimensions with OpenTelemetry).
Callers never pass secrets: ids, types, counts, statuses and already-redacted errors only.
"""

from __future__ import annotations

import logging
from typing import Any

from outbox.text import escape_controls


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log ``event`` with ``fields`` (None values are left out)."""
    if not logger.isEnabledFor(level):
        return
    present = {key: value for key, value in fields.items() if value is not None}
    text = " ".join(f"{key}={_format(value)}" for key, value in present.items())
    extra = {f"outbox_{key}": value for key, value in present.items()}
    logger.log(level, "%s %s", event, text, extra={"outbox_event": event, **extra})


def _format(value: Any) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    # An event type or a receiver's error may hold a newline and a line of its own: escaped.
    return escape_controls(text)
