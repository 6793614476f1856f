"""outbox.inbox.verify against requests signed by the public ``standardwebhooks`` package."""

from __future__ import annotations

import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from outbox.core.errors import ConfigurationError, InvalidSignature
from outbox.producer.inbox import WebhookEvent, verify

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks documentation's example
OTHER = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
MSG_ID = "0b6e4b0e-6f0a-4a53-9a55-43a57ab2b7a1"
BODY = json.dumps(
    {
        "id": MSG_ID,
        "type": "OrderCompleted",
        "timestamp": "2026-01-02T03:04:05.123456+00:00",
        "data": {"orderId": 42, "note": "Zoë"},
    },
    ensure_ascii=False,
).encode()


def signed(
    body: bytes = BODY,
    *,
    secret: str = SECRET,
    msg_id: str = MSG_ID,
    age_seconds: float = 0,
) -> dict[str, str]:
    """The headers the standardwebhooks package would send with ``body``."""
    timestamp = datetime.fromtimestamp(time.time() - age_seconds, tz=UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, timestamp, body.decode()),
    }


def rejected(body: bytes | str, headers: dict[str, str], secret: Any = SECRET) -> str:
    with pytest.raises(InvalidSignature) as refused:
        verify(body, headers, secret)
    message = str(refused.value)
    for secret_text in (SECRET, SECRET.removeprefix("whsec_"), OTHER.removeprefix("whsec_")):
        assert secret_text not in message
    return message


def test_a_signed_request_gives_its_event() -> None:
    event = verify(BODY, signed(), SECRET)
    assert event == WebhookEvent(
        id=MSG_ID,
        type="OrderCompleted",
        timestamp=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        data={"orderId": 42, "note": "Zoë"},
    )
    with pytest.raises(ValueError, match="frozen"):
        event.type = "Other"  # type: ignore[misc]


def test_the_body_may_be_text_and_the_headers_in_any_case() -> None:
    headers = signed()
    shouted = {name.upper(): value for name, value in headers.items()}
    titled = {name.title(): value for name, value in headers.items()}
    assert verify(BODY.decode(), shouted, SECRET).id == MSG_ID
    assert verify(BODY, titled, SECRET).id == MSG_ID


def test_during_a_rotation_any_of_the_secrets_may_have_signed() -> None:
    headers = signed()
    assert verify(BODY, headers, f"{OTHER} {SECRET}").id == MSG_ID
    assert verify(BODY, headers, [OTHER, SECRET]).id == MSG_ID
    # The sender's side of a rotation: one signature per secret, any one of them may match.
    both = signed(secret=OTHER)["webhook-signature"] + " " + headers["webhook-signature"]
    assert verify(BODY, {**headers, "webhook-signature": both}, SECRET).id == MSG_ID


@pytest.mark.parametrize(
    ("body", "change"),
    [
        (BODY.replace(b"42", b"43"), {}),
        (BODY + b" ", {}),
        (BODY, {"webhook-id": "0b6e4b0e-6f0a-4a53-9a55-43a57ab2b7a2"}),
        (BODY, {"webhook-signature": "v1,AAAA" + "A" * 40}),
        (BODY, {"webhook-signature": "v2," + signed()["webhook-signature"][3:]}),
        (BODY, {"webhook-signature": "v1,Zoë-not-base64"}),
    ],
    ids=["data", "trailing byte", "id", "forged", "other version", "not ascii"],
)
def test_a_tampered_request_is_rejected(body: bytes, change: dict[str, str]) -> None:
    headers = signed() | change
    assert "no signature" in rejected(body, headers)


def test_a_request_whose_timestamp_was_changed_is_rejected() -> None:
    headers = signed()
    earlier = str(int(headers["webhook-timestamp"]) - 1)  # still well within the tolerance
    assert "no signature" in rejected(BODY, headers | {"webhook-timestamp": earlier})


def test_a_request_signed_with_another_secret_is_rejected() -> None:
    assert "no signature" in rejected(BODY, signed(secret=OTHER))


@pytest.mark.parametrize("age_seconds", [6 * 60, -6 * 60, 3 * 3600])
def test_a_stale_or_future_timestamp_is_rejected_even_when_signed(age_seconds: float) -> None:
    assert "more than 5 minutes" in rejected(BODY, signed(age_seconds=age_seconds))


@pytest.mark.parametrize("age_seconds", [4 * 60, -4 * 60])
def test_a_timestamp_within_five_minutes_either_way_is_accepted(age_seconds: float) -> None:
    assert verify(BODY, signed(age_seconds=age_seconds), SECRET).id == MSG_ID


@pytest.mark.parametrize("header", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_rejected_by_name(header: str) -> None:
    headers = signed()
    del headers[header]
    assert f"no {header} header" in rejected(BODY, headers)


@pytest.mark.parametrize("timestamp", ["soon", "1.5e9", "-1", " 1767312000", "9" * 20])
def test_a_timestamp_that_is_not_whole_seconds_is_rejected(timestamp: str) -> None:
    headers = signed() | {"webhook-timestamp": timestamp}
    assert "not a number of seconds" in rejected(BODY, headers)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"type": "OrderCompleted", "timestamp": "2026-01-02T03:04:05Z"}', "data"),
        (b'{"type": "X", "timestamp": "2026-01-02T03:04:05", "data": {}}', "timestamp"),
        (b'{"id": "another", "type": "X", "timestamp": "2026-01-02T03:04:05Z", "data": {}}', "id"),
    ],
    ids=["not json", "not an object", "no data", "naive timestamp", "other id"],
)
def test_a_signed_body_that_is_no_webhook_event_is_rejected(body: bytes, expected: str) -> None:
    assert expected in rejected(body, signed(body))


def test_a_body_without_its_own_id_takes_the_request_s() -> None:
    body = b'{"type": "X", "timestamp": "2026-01-02T03:04:05Z", "data": {"a": 1}}'
    event = verify(body, signed(body, msg_id="msg_2"), SECRET)
    assert (event.id, event.type, event.data) == ("msg_2", "X", {"a": 1})


@pytest.mark.parametrize(
    "secret", ["", [], "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!notbase64"]
)
def test_a_misconfigured_secret_is_a_configuration_error_that_does_not_quote_it(
    secret: Any,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        verify(BODY, signed(), secret)
    assert "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" not in str(refused.value)
    assert "notbase64" not in str(refused.value)


def test_signatures_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[str, str]] = []
    original = hmac.compare_digest

    def recording(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return original(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    headers = signed()
    verify(BODY, headers, SECRET)
    rejected(BODY, signed(secret=OTHER))
    assert (headers["webhook-signature"], headers["webhook-signature"]) in compared
    assert len(compared) == 2  # every candidate signature went through compare_digest
