"""The webhook body: a fixed envelope around the stored payload, exactly as json.dumps writes it."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import pytest

from outbox.core.models import LeasedMessage
from outbox.transport.publisher import build_body


def message(event_type: str, created_at: dt.datetime, payload: str) -> LeasedMessage:
    message_id = uuid.UUID("0b6e1d2c-3f4a-4b5c-8d6e-7f8091a2b3c4")
    return LeasedMessage(
        message_id, event_type, payload, len(payload.encode()), 1, uuid.uuid4(), created_at
    )


@pytest.mark.parametrize(
    "event_type",
    ["OrderCompleted", 'Quoted "type" \\ here', "Bestellung.Abgeschlossen.Ü", "注文完了"],
)
@pytest.mark.parametrize(
    "created_at",
    [
        dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC),
        dt.datetime(2026, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))),
    ],
)
def test_body_is_the_envelope_with_the_stored_payload_spliced_in(
    event_type: str, created_at: dt.datetime
) -> None:
    stored = '{"total": "9.99", "note": "é \\u0001 \\"q\\""}'
    body = build_body(message(event_type, created_at, stored), stored)
    envelope = json.dumps(
        {
            "id": "0b6e1d2c-3f4a-4b5c-8d6e-7f8091a2b3c4",
            "type": event_type,
            "timestamp": created_at.isoformat(),
        },
        ensure_ascii=False,
    )
    assert body == f'{envelope[:-1]}, "data": {stored}}}'.encode()
    assert json.loads(body)["data"] == json.loads(stored)
