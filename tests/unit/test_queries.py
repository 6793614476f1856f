from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from outbox.store import QUERIES
from outbox.store.contract import SentAttempt
from outbox.store.outcome_rows import AttemptRow, OutcomeRow
from outbox.store.schema import INBOX_MIGRATIONS, RELAY_MIGRATIONS
from outbox.store.sql import fill


def test_record_outcomes_columns_are_the_outcome_row_fields_in_order() -> None:
    # The statement names its array parameters' columns; OutcomeRow fills them by position.
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


def test_a_name_filled_into_a_statement_must_be_a_plain_identifier() -> None:
    assert fill("DROP TABLE {table};", table="outbox_messages_p20260102") == (
        "DROP TABLE outbox_messages_p20260102;"
    )
    assert fill("PRIMARY KEY ({columns})", columns=("id", "created_at")) == (
        "PRIMARY KEY (id, created_at)"
    )
    moment = datetime(2026, 1, 2, tzinfo=UTC)
    assert fill("TO ({upper})", upper=moment) == "TO ('2026-01-02T00:00:00+00:00')"
    assert fill("SELECT '{kept}'", table="x") == "SELECT '{kept}'"  # not given: left alone
    for bad in ('x"; DROP TABLE y; --', "Outbox", "1st", ""):
        with pytest.raises(ValueError, match="not a plain identifier"):
            fill("DROP TABLE {table};", table=bad)


def test_the_relay_s_and_the_inbox_s_migrations_share_one_set_of_bookkeeping_statements() -> None:
    def sql(statement: str) -> str:
        return "\n".join(line for line in statement.splitlines() if not line.startswith("--"))

    for name in ("create_migrations_table", "applied_migrations", "record_migration"):
        relay = sql(RELAY_MIGRATIONS.statement(name))
        inbox = sql(INBOX_MIGRATIONS.statement(name))
        assert "outbox_migrations" in relay
        assert relay.replace("outbox_migrations", "outbox_inbox_migrations") == inbox
    # Each set's migrators serialise on a key of their own: its table's name, as always.
    assert RELAY_MIGRATIONS.lock_key == "outbox_migrations"
    assert INBOX_MIGRATIONS.lock_key == "outbox_inbox_migrations"
    assert "hashtext($1)" in QUERIES["lock_migrations"]
