from __future__ import annotations

import logging

import pytest

from outbox.core.logs import log_event
from outbox.core.models import Response
from outbox.core.outcomes import attempt_facts, bounded
from outbox.core.text import escape_controls, first_control

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


WOMAN_TECHNOLOGIST = "\U0001f469\u200d\U0001f4bb"  # woman, zero width joiner, laptop
I_WANT = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # Persian, with a zero width non-joiner


def test_joiners_that_join_letters_or_symbols_are_text_and_are_not_escaped() -> None:
    assert escape_controls(f"{WOMAN_TECHNOLOGIST} {I_WANT}") == f"{WOMAN_TECHNOLOGIST} {I_WANT}"
    assert first_control(I_WANT) is None


def test_joiners_that_join_nothing_are_escaped_like_any_format_character() -> None:
    assert escape_controls("Order\u200dCompleted") == "Order\\u200dCompleted"
    assert escape_controls("\u200c\u0645 \U0001f469\u200d") == "\\u200c\u0645 \U0001f469\\u200d"
    assert escape_controls("\u0645\u200d\u200d\u06cc") == "\u0645\\u200d\\u200d\u06cc"
    # The characters that look alike or reorder a line stay escaped between any letters.
    assert escape_controls("\u0645\u200b\u06cc\u202e\u0645\u2066") == (
        "\u0645\\u200b\u06cc\\u202e\u0645\\u2066"
    )
    assert first_control("\U0001f469\u200d\U0001f4bb\ufeff") == "\ufeff"


def test_a_log_line_shows_a_joined_event_type_as_written_and_a_forged_one_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("outbox.test")
    with caplog.at_level(logging.INFO, "outbox.test"):
        log_event(logger, logging.INFO, "outbox.delivery", event_type=WOMAN_TECHNOLOGIST)
        log_event(logger, logging.INFO, "outbox.delivery", event_type=f"{I_WANT}\u202e\nERROR x")
    joined, forged = (record.getMessage() for record in caplog.records)
    assert joined == f"outbox.delivery event_type={WOMAN_TECHNOLOGIST}"
    assert forged == f'outbox.delivery event_type="{I_WANT}\\u202e\\x0aERROR x"'
