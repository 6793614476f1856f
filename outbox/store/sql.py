"""Named statements: a ``.sql`` file of ``-- name --`` entries read into ``{name: statement}``.

``QUERIES`` holds the store's own (``queries.sql`` beside this module); the operators' layer and
the partitioned layout load theirs the same way (``load``). A statement that names a table
takes it as ``{table}``, filled in by ``fill`` once the name is checked (DDL, which binds no
parameter, takes a time the same way); values are otherwise always bound parameters. Imports no
driver: a producer reads its statement here without loading asyncpg.
"""

from __future__ import annotations

import re
from datetime import datetime
from importlib.resources import files

_ENTRY = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# What a name filled into a statement may be: a plain, unquoted PostgreSQL identifier.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def load_queries(text: str) -> dict[str, str]:
    """Split ``-- name --`` sections into ``{name: statement}``; the comment lines are kept."""
    parts = _ENTRY.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load(package: str, resource: str) -> dict[str, str]:
    """The named statements of the file ``resource`` of ``package`` (package data)."""
    return load_queries(files(package).joinpath(resource).read_text(encoding="utf-8"))


def identifier(name: str) -> str:
    """``name`` if it is a plain identifier (lower case, digits, ``_``), else ValueError."""
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return name


def fill(statement: str, **parts: str | tuple[str, ...] | datetime) -> str:
    """``statement`` with each ``{placeholder}`` given replaced: an identifier (checked), a list
    of identifiers (``a, b``), or a time (a quoted ISO 8601 literal, for DDL)."""

    def filled(match: re.Match[str]) -> str:
        if match.group(1) not in parts:
            return match.group(0)
        part = parts[match.group(1)]
        if isinstance(part, datetime):
            return f"'{part.isoformat()}'"
        if isinstance(part, tuple):
            return ", ".join(identifier(name) for name in part)
        return identifier(part)

    return _PLACEHOLDER.sub(filled, statement)


QUERIES = load("outbox.store", "queries.sql")
