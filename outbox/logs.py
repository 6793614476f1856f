"""Structured log lines: ``event key=value …`` for people, the same fields in ``extra`` for tools.

Plain ``logging``, so the Functions host (and Application Insights) takes them as they are; the
fields arrive as ``outbox_<name>`` attributes on the record (custom dimensions with OpenTelemetry).
Callers never pass secrets: ids, types, counts, statuses and already-redacted errors only.
"""

from __future__ import annotations

import logging
from typing import Any

from outbox.telemetry import trace_ids
from outbox.text import escape_controls


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
