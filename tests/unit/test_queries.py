from __future__ import annotations

import re

from outbox.store import QUERIES, AttemptRow, OutcomeRow, SentAttempt


def test_record_outcomes_columns_are_the_outcome_row_fields_in_order() -> None:
    # The statement names its array parameters' columns; store.OutcomeRow fills them by position.
    statement = QUERIES["record_outcomes"]
    match = re.search(r"\) *\n? *AS o\(([^)]*)\)", statement)
    assert match is not None
    columns = [name.strip() for name in match.group(1).split(",")]
    assert columns == list(OutcomeRow._fields)
    attempts = re.search(r"\) *\n? *AS a\(([^)]*)\)", statement)
    assert attempts is not None
    attempt_columns = [name.strip() for name in attempts.group(1).split(",")]
    assert attempt_columns == list(AttemptRow._fields)
    arrays = re.findall(r"\$(\d+)::[a-z0-9]+\[\]", statement)
    assert sorted(map(int, arrays)) == list(range(1, len(columns) + len(attempt_columns) + 1))


def test_record_delivered_columns_are_the_sent_attempt_fields_in_order() -> None:
    statement = QUERIES["record_delivered"]
    messages = re.search(r"\) *\n? *AS o\(([^)]*)\)", statement)
    assert messages is not None
    assert [name.strip() for name in messages.group(1).split(",")] == [
        "outbox_message_id",
        "lease_token",
    ]
    attempts = re.search(r"\) *\n? *AS a\(([^)]*)\)", statement)
    assert attempts is not None
    columns = [name.strip() for name in attempts.group(1).split(",")]
    assert columns == list(SentAttempt._fields)
    arrays = re.findall(r"\$(\d+)::[a-z0-9]+\[\]", statement)
    assert sorted(map(int, arrays)) == list(range(1, 2 + len(columns) + 1))
