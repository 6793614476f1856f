from __future__ import annotations

from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from outbox.core.settings import decode_secret
from outbox.core.signing import Signer, sign, verify

# The Standard Webhooks reference test vector.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
BODY = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_reference_vector() -> None:
    assert sign([decode_secret(SECRET)], MSG_ID, TIMESTAMP, BODY) == EXPECTED


def test_signature_matches_the_standardwebhooks_package() -> None:
    theirs = Webhook(SECRET).sign(MSG_ID, datetime.fromtimestamp(TIMESTAMP, tz=UTC), BODY.decode())
    assert sign([decode_secret(SECRET)], MSG_ID, TIMESTAMP, BODY) == theirs


def test_one_signature_per_secret_during_rotation() -> None:
    other = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    header = sign([decode_secret(other), decode_secret(SECRET)], MSG_ID, TIMESTAMP, BODY)
    first, second = header.split(" ")
    assert second == EXPECTED
    assert first.startswith("v1,")
    assert first != second


def test_a_signer_signs_every_message_afresh() -> None:
    # The prepared key state is copied per message: signing one message must not leak into
    # the next, whatever order they come in.
    signer = Signer([decode_secret(SECRET)])
    assert signer.sign("msg_other", TIMESTAMP, b"{}") != EXPECTED
    assert signer.sign(MSG_ID, TIMESTAMP, BODY) == EXPECTED
    assert signer.sign(MSG_ID, TIMESTAMP, BODY) == EXPECTED


def test_a_signer_without_keys_is_false_and_signs_nothing() -> None:
    assert not Signer([])
    assert Signer([]).sign(MSG_ID, TIMESTAMP, BODY) == ""
    assert Signer([decode_secret(SECRET)])


@pytest.mark.parametrize(
    ("field", "value"),
    [("webhook-id", "msg_other"), ("webhook-timestamp", str(TIMESTAMP + 1)), ("body", b"{}")],
)
def test_verify_rejects_tampering(field: str, value: object) -> None:
    headers = {
        "webhook-id": MSG_ID,
        "webhook-timestamp": str(TIMESTAMP),
        "webhook-signature": EXPECTED,
    }
    body = BODY
    assert verify(SECRET, headers, body)
    if field == "body":
        body = value  # type: ignore[assignment]
    else:
        headers[field] = value  # type: ignore[assignment]
    assert not verify(SECRET, headers, body)
