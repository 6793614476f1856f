"""The statements every driver runs are the store's, rewritten mechanically for its style."""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from outbox import store
from outbox.producer import drivers


def test_placeholders_become_psycopg_names_and_a_repeated_one_keeps_its_name() -> None:
    sql = "-- a comment with $9 and 5%\nSELECT $1::text, $2, $1 %  2, $10\n  -- another\nFROM t"
    assert drivers.pyformat(sql) == "SELECT %(p1)s::text, %(p2)s, %(p1)s %%  2, %(p10)s\nFROM t"


def test_named_arguments_follow_the_positions() -> None:
    statement = store.Statement("insert_message", ("a", None, 3))
    assert drivers.named_args(statement) == {"p1": "a", "p2": None, "p3": 3}


@pytest.mark.parametrize(
    "statement",
    [store.insert_message(uuid.uuid4(), "OrderCompleted", "{}", "key"), store.claim_inbox("msg")],
    ids=lambda s: s.name,
)
def test_each_statement_a_caller_s_driver_runs_uses_every_argument_and_no_other(
    statement: store.Statement,
) -> None:
    # The one statement of queries.sql, no copy: for psycopg each $n is a name with an argument.
    assert statement.sql == store.QUERIES[statement.name]
    rewritten = drivers.pyformat(statement.sql)
    assert "$" not in rewritten
    assert "--" not in rewritten
    names = set(re.findall(r"%\(([a-z0-9]+)\)s", rewritten))
    assert names == set(drivers.named_args(statement))


def test_sqlalchemy_s_asyncpg_dialect_takes_the_statement_as_it_is() -> None:
    statement = store.claim_inbox("msg")
    dialect = postgresql.asyncpg.dialect()
    assert drivers.for_dialect(dialect, statement) == (statement.sql, ("msg",))
    psycopg = postgresql.psycopg.dialect()
    assert drivers.for_dialect(psycopg, statement) == (
        drivers.pyformat(statement.sql),
        {"p1": "msg"},
    )


def test_a_database_other_than_postgresql_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"not sqlite\+pysqlite"):
        drivers.for_dialect(sqlite.dialect(), store.claim_inbox("msg"))
