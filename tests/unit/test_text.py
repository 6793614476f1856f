from __future__ import annotations

import logging

import pytest

from outbox.core.logs import log_event
from outbox.core.models import Response
from outbox.core.outcomes import attempt_facts, bounded
from outbox.core.text import escape_controls

HOSTILE = "ok\x1b[2J\x1b]0;owned\x07 line\r\nERROR forged\u2028next\u202eevil\x00"


def test_control_characters_are_escaped_and_ordinary_text_is_not() -> None:
    assert escape_controls("Bestellung über 5 € — 注文 ✅") == "Bestellung über 5 € — 注文 ✅"
    assert escape_controls("a\x1b[2Jb\x07c\u2028d\u202ee") == "a\\x1b[2Jb\\x07c\\u2028d\\u202ee"


def test_stored_errors_and_snippets_hold_no_control_character() -> None:
    error = bounded(f"HTTP 500: {HOSTILE}")
    assert error.isprintable()
    for escaped in ("\\x1b[2J", "\\x07", "\\u202e"):
        assert escaped in error
    snippet = attempt_facts(Response(500, snippet=HOSTILE)).response_snippet
    assert snippet is not None
    # A snippet keeps its line breaks (it is a body, shown as JSON); nothing else.
    assert set(snippet) - set(snippet.translate({10: None})) <= {"\n"}
    assert snippet.replace("\n", "").isprintable()
    assert "\\x0d" in snippet


def test_log_fields_cannot_forge_a_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("outbox.test")
    with caplog.at_level(logging.INFO, "outbox.test"):
        log_event(logger, logging.INFO, "outbox.delivery", event_type="A\nERROR outbox.drain: x")
    [record] = caplog.records
    assert "\n" not in record.getMessage()
    assert record.getMessage() == 'outbox.delivery event_type="A\\x0aERROR outbox.drain: x"'
