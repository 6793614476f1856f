"""A minimal reader of the ``pgoutput`` plugin's messages (logical replication protocol 1):
Begin, Relation, Insert and Commit, which is all an outbox publication with ``publish =
'insert'`` sends. Any other message is skipped. Column values come as text, as PostgreSQL's
output functions write them (jsonb's text, a timestamptz in the session's zone).

Message formats: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

_INT32 = struct.Struct("!I")
_INT16 = struct.Struct("!H")
_COMMIT = struct.Struct("!bqqq")  # flags, commit LSN, transaction end LSN, commit time


def format_lsn(lsn: int) -> str:
    """``1/A2B3C4D0``, as PostgreSQL writes a pg_lsn."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


@dataclass
class Transaction:
    """The outbox rows one committed transaction inserted, in the order it inserted them."""

    rows: list[dict[str, str | None]] = field(default_factory=list)
    commit_lsn: int = 0
    end_lsn: int = 0  # what a consumer confirms once the transaction is done with


class Decoder:
    """Feed it each message's bytes in stream order; ``feed`` returns a Transaction at its
    Commit (or None), with the inserted rows of the relation named ``table`` as dicts."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._columns: dict[int, list[str] | None] = {}  # relation oid → its column names
        self._open: Transaction | None = None

    @property
    def idle(self) -> bool:
        """No transaction begun and not yet committed."""
        return self._open is None

    def feed(self, data: bytes) -> Transaction | None:
        kind = data[:1]
        if kind == b"I":
            self._insert(data)
        elif kind == b"B":
            self._open = Transaction()
        elif kind == b"C":
            return self._commit(data)
        elif kind == b"R":
            self._relation(data)
        return None

    def _insert(self, data: bytes) -> None:
        (oid,) = _INT32.unpack_from(data, 1)
        columns = self._columns.get(oid)
        if columns is None or self._open is None:
            return
        # data[5] is b"N": a new tuple follows.
        values, _ = read_tuple(data, 6)
        self._open.rows.append(dict(zip(columns, values, strict=True)))

    def _commit(self, data: bytes) -> Transaction | None:
        done, self._open = self._open, None
        if done is None:
            return None
        _, done.commit_lsn, done.end_lsn, _ = _COMMIT.unpack_from(data, 1)
        return done

    def _relation(self, data: bytes) -> None:
        (oid,) = _INT32.unpack_from(data, 1)
        at = 5
        _namespace, at = read_string(data, at)
        name, at = read_string(data, at)
        at += 1  # replica identity setting
        (count,) = _INT16.unpack_from(data, at)
        at += 2
        names = []
        for _ in range(count):
            at += 1  # flags
            column, at = read_string(data, at)
            names.append(column)
            at += 8  # type oid, type modifier
        self._columns[oid] = names if name == self.table else None


def read_string(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(0, at)
    return data[at:end].decode(), end + 1


def read_tuple(data: bytes, at: int) -> tuple[list[str | None], int]:
    (count,) = _INT16.unpack_from(data, at)
    at += 2
    values: list[str | None] = []
    for _ in range(count):
        kind = data[at : at + 1]
        at += 1
        if kind == b"t":
            (length,) = _INT32.unpack_from(data, at)
            at += 4
            values.append(data[at : at + length].decode())
            at += length
        else:  # b"n" null, b"u" an unchanged TOAST value (never in an insert)
            values.append(None)
    return values, at
