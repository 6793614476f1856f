from __future__ import annotations

import json

from outbox.core.settings import decode_secret
from outbox.core.signing import sign
from outbox.hosting.demo_receiver import describe

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
BODY = json.dumps({"id": "m1", "type": "OrderCompleted", "data": {"orderId": 1}}).encode()


def signed_headers(body: bytes) -> dict[str, str]:
    return {
        "webhook-id": "m1",
        "webhook-timestamp": "1700000000",
        "webhook-signature": sign([decode_secret(SECRET)], "m1", 1700000000, body),
    }


def test_prints_type_id_signature_and_data() -> None:
    line = describe(BODY, signed_headers(BODY), SECRET)
    assert line == 'received OrderCompleted m1 (signature valid): {"orderId": 1}'


def test_flags_a_bad_or_missing_signature() -> None:
    assert "(signature INVALID)" in describe(BODY + b" ", signed_headers(BODY), SECRET)
    assert "(signature MISSING)" in describe(BODY, {"webhook-id": "m1"}, SECRET)
    assert "(signature not checked)" in describe(BODY, signed_headers(BODY), None)


def test_survives_an_unreadable_body() -> None:
    assert "unreadable body (3 bytes)" in describe(b"\xff\x00x", {}, None)
    assert "unreadable body (40000 bytes)" in describe(b"[" * 40_000, {}, None)
