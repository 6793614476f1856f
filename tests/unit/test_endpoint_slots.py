"""The fair share's count of contending endpoints, kept as they change (``EndpointSlots``)."""

from __future__ import annotations

import math
import random

from outbox.relay.dispatch import EndpointSlots

KEYS = [("T", f"e{n}") for n in range(12)]


def share_counted_over_every_endpoint(slots: EndpointSlots, key: tuple[str, str]) -> int:
    """The share as it was computed before: every configured endpoint looked at."""
    others = sum(
        1
        for other in KEYS
        if other != key and (slots.waiting.get(other) or other not in slots._quiet)
    )
    return math.ceil(512 / (others + 1))


def test_the_kept_count_gives_the_share_counting_every_endpoint_would() -> None:
    chance = random.Random(7)
    slots = EndpointSlots(512, dict.fromkeys(KEYS))
    for _ in range(5_000):
        key = chance.choice(KEYS)
        step = chance.randrange(5)
        if step == 0:
            slots.queued(key, chance.randint(1, 3))
        elif step == 1 and slots.waiting.get(key):
            slots.dequeued(key, chance.randint(1, slots.waiting[key]))
        elif step == 2:
            found = set(chance.sample(KEYS, chance.randint(0, 3)))
            looked = None if chance.random() < 0.5 else set(chance.sample(KEYS, 6)) | found
            slots.leased(found, looked)
        elif step == 3:
            slots.found(key)
        elif chance.random() < 0.1:
            slots.unsure()
        for each in KEYS:
            assert slots._share(each) == share_counted_over_every_endpoint(slots, each)


def test_an_endpoint_alone_with_work_gets_every_slot_once_the_others_are_quiet() -> None:
    slots = EndpointSlots(512, dict.fromkeys(KEYS))
    busy = KEYS[0]
    assert slots._share(busy) == math.ceil(512 / len(KEYS))  # nobody known quiet yet
    slots.queued(busy, 100)
    slots.leased({busy}, None)  # a short lease found messages for it alone
    assert slots._share(busy) == 512
    slots.queued(KEYS[1], 1)  # another's delivery waits: it contends again
    assert slots._share(busy) == 256
    slots.dequeued(KEYS[1], 1)
    assert slots._share(busy) == 512
    slots.unsure()  # a full lease: anyone may have more due
    assert slots._share(busy) == math.ceil(512 / len(KEYS))
