"""Text from outside (a receiver's body, an exception, an event type) made safe to store and show.

A receiver's body may hold terminal escapes (``\\x1b[2J``, an OSC title sequence, BEL) and an
event type a newline followed by a forged log line: shown as they are, they would clear an
operator's screen or add a line to the log that the relay never wrote. Every control character
(and every Unicode format, line and paragraph separator) is shown as an escape instead.
"""

from __future__ import annotations

import unicodedata

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def escape_controls(text: str, *, keep: str = "") -> str:
    """``text`` with each control character written as ``\\xNN`` or ``\\uNNNN`` (those in
    ``keep``, such as a snippet's newlines, stay)."""
    if text.isprintable():
        return text  # the usual case: nothing to escape
    return "".join(_escaped(char) if char not in keep and _unsafe(char) else char for char in text)


def first_control(text: str) -> str | None:
    """The first character of ``text`` that ``escape_controls`` would escape, if any."""
    if text.isprintable():
        return None
    return next((char for char in text if _unsafe(char)), None)


def storable(text: str) -> str:
    """``text`` with each U+0000 (which PostgreSQL text cannot hold) shown as U+FFFD.

    A receiver's body may contain one; stored as sent, it would fail the whole batch's write.
    """
    return text.replace("\x00", "\ufffd")


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
