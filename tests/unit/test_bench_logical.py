"""The log-tailing prototype (bench/logical, docs/log-tailing.md): its pgoutput reader on made-up
messages, and its order check on a private PostgreSQL 18 with ``wal_level = logical`` that the
test starts itself (no timing asserted)."""

from __future__ import annotations

import asyncio
import struct

from bench.logical import measure
from bench.logical.pgoutput import Decoder, format_lsn, parse_lsn
from bench.logical.server import private_server

OUTBOX_OID, OTHER_OID = 16400, 16500


def cstring(text: str) -> bytes:
    return text.encode() + b"\0"


def relation(oid: int, name: str, columns: list[str]) -> bytes:
    described = b"".join(b"\0" + cstring(c) + struct.pack("!Ii", 25, -1) for c in columns)
    head = b"R" + struct.pack("!I", oid) + cstring("public") + cstring(name) + b"d"
    return head + struct.pack("!H", len(columns)) + described


def insert(oid: int, values: list[str | None]) -> bytes:
    cells = b"".join(
        b"n" if v is None else b"t" + struct.pack("!I", len(v.encode())) + v.encode()
        for v in values
    )
    return b"I" + struct.pack("!I", oid) + b"N" + struct.pack("!H", len(values)) + cells


def begin() -> bytes:
    return b"B" + struct.pack("!qqI", 0x1_0000_0100, 0, 700)


def commit(end_lsn: int) -> bytes:
    return b"C" + struct.pack("!bqqq", 0, end_lsn - 8, end_lsn, 0)


def test_the_decoder_returns_a_transactions_outbox_rows_at_its_commit() -> None:
    decoder = Decoder("outbox_messages")
    decoder.feed(relation(OUTBOX_OID, "outbox_messages", ["outbox_message_id", "ordering_key"]))
    decoder.feed(relation(OTHER_OID, "orders", ["id"]))
    assert decoder.feed(begin()) is None
    assert not decoder.idle
    decoder.feed(insert(OTHER_OID, ["7"]))  # another table's change: skipped
    decoder.feed(insert(OUTBOX_OID, ["a1", "key-1"]))
    decoder.feed(insert(OUTBOX_OID, ["a2", None]))
    done = decoder.feed(commit(0x2_0000_0040))
    assert done is not None
    assert done.rows == [
        {"outbox_message_id": "a1", "ordering_key": "key-1"},
        {"outbox_message_id": "a2", "ordering_key": None},
    ]
    assert done.end_lsn == 0x2_0000_0040
    assert decoder.idle


def test_a_transaction_without_outbox_rows_is_still_returned_to_be_confirmed() -> None:
    decoder = Decoder("outbox_messages")
    decoder.feed(relation(OTHER_OID, "orders", ["id"]))
    decoder.feed(begin())
    decoder.feed(insert(OTHER_OID, ["7"]))
    done = decoder.feed(commit(0x3000))
    assert done is not None
    assert (done.rows, done.end_lsn) == ([], 0x3000)


def test_an_lsn_reads_back_as_postgresql_writes_it() -> None:
    assert format_lsn(0x1_A2B3C4D0) == "1/A2B3C4D0"
    assert parse_lsn("1/A2B3C4D0") == 0x1_A2B3C4D0


def test_the_tailer_keeps_commit_order_where_created_at_order_differs() -> None:
    # Per key, A begins and inserts first, B commits first: created_at says A, B; commits B, A.
    with private_server("logical") as server:
        servers = measure.Servers(server, None)
        tailed = asyncio.run(measure.order_once("stream", servers, keys=3))
        polled = asyncio.run(measure.order_once("poll", servers, keys=3))
    assert (tailed["commit_order"], tailed["created_at_order"]) == (3, 0)
    assert (polled["commit_order"], polled["created_at_order"]) == (0, 3)
