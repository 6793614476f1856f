"""Message ids: UUIDv7 (RFC 9562), ordered by the time they were made.

A message's id is the primary key of ``outbox_messages`` and leads the key of
``outbox_attempts``. Random ids (version 4) land each new entry on a random page of both B-trees,
where it splits pages all over the index and keeps each of them in the cache; ids that grow with
time land at the right edge, where PostgreSQL's splits leave pages nearly full and write little
(docs/performance.md, "WAL per message"). The id tells when its message was made, to the
millisecond, as ``created_at`` already does.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_NS_PER_MS = 1_000_000
_VERSION_7 = 0x7 << 12
_lock = threading.Lock()
_last_head = 0


def new_message_id() -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix time in milliseconds, 12 bits of the millisecond's
    fraction (RFC 9562, 6.2, method 3), then the variant and 62 random bits. Ids made later in
    one process sort later: where the clock has not moved on (or went back), the time and
    fraction of the last id plus one are used."""
    global _last_head  # noqa: PLW0603 - one sequence per process
    millis, rest = divmod(time.time_ns(), _NS_PER_MS)
    head = (millis & ((1 << 48) - 1)) << 16 | _VERSION_7 | rest * 4096 // _NS_PER_MS
    with _lock:
        if head <= _last_head:
            head = _last_head + 1
            if head & 0xF000 != _VERSION_7:  # the fraction ran over: the next millisecond
                head = ((head >> 16) + 1) << 16 | _VERSION_7
        _last_head = head
    tail = 0b10 << 62 | int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    return uuid.UUID(int=head << 64 | tail)
