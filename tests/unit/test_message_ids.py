"""Generated message ids: UUIDv7 (RFC 9562) carrying the time they were made."""

from __future__ import annotations

import time
import uuid
from typing import Any

from outbox.core import ids
from outbox.core.ids import new_message_id


def test_an_id_is_version_7_of_the_rfc_variant_and_carries_its_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    made = new_message_id()
    after = time.time_ns() // 1_000_000
    assert made.version == 7
    assert made.variant == uuid.RFC_4122
    assert before <= made.int >> 80 <= after


def test_ids_made_one_after_another_sort_in_that_order_and_differ() -> None:
    made = [new_message_id() for _ in range(10_000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    # Bytewise order is PostgreSQL's order of uuid values.
    assert [m.bytes for m in made] == sorted(m.bytes for m in made)


def test_the_random_bits_differ_between_ids_of_one_millisecond() -> None:
    made = [new_message_id() for _ in range(1_000)]
    assert len({m.int & ((1 << 62) - 1) for m in made}) == len(made)


def test_ids_keep_rising_when_the_clock_stands_still_or_goes_back(monkeypatch: Any) -> None:
    now = [time.time_ns() + 10**12]  # ahead of every id made so far in this process
    monkeypatch.setattr(ids.time, "time_ns", lambda: now[0])
    made = [new_message_id() for _ in range(5_000)]  # more than a millisecond's 4,096 fractions
    now[0] -= 3_600 * 10**9
    made.append(new_message_id())
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert {m.version for m in made} == {7}
    # The fractions of the clock's millisecond ran out: the ids went on into the next ones.
    assert 1 <= (made[-1].int >> 80) - (made[0].int >> 80) <= 2
