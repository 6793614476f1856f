"""When a hint counts as sent, for the clearing of hints a drain covered: the latest time it
carries, so that a hint refreshed in place (its insertion time unchanged) is judged by its
refresh."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from outbox.transport.covered import hint_time

INSERTED = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)


def stored(content: object) -> str:
    return base64.b64encode(json.dumps(content).encode()).decode()


def test_a_hint_counts_from_when_the_queue_took_it_unless_it_carries_a_later_time() -> None:
    assert hint_time(stored({"requestedAt": "2026-12-07T11:59:59+00:00"}), INSERTED) == (
        INSERTED.timestamp()
    )
    refreshed = stored({"requestedAt": "2026-12-07T12:00:30+00:00"})
    assert hint_time(refreshed, INSERTED) == INSERTED.timestamp() + 30
    delayed = stored({"requestedAt": "2026-12-07T12:00:00+00:00", "wakeAt": "2026-12-07T13:00:00Z"})
    assert hint_time(delayed, INSERTED) == INSERTED.timestamp() + 3600


def test_times_that_are_not_aware_iso_8601_are_passed_over() -> None:
    for value in ("soon", "2999-01-01T00:00:00", 12, None, ["2999-01-01T00:00:00Z"]):
        assert hint_time(stored({"requestedAt": value}), INSERTED) == INSERTED.timestamp()
    assert hint_time("not base64!", INSERTED) == INSERTED.timestamp()
    assert hint_time(stored(["2999-01-01T00:00:00Z"]), INSERTED) == INSERTED.timestamp()
    assert hint_time("not base64!", None) is None
    assert hint_time(stored({"requestedAt": "2026-12-07T12:00:30+00:00"}), None) == (
        INSERTED.timestamp() + 30
    )
