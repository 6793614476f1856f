"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping

from outbox.settings import decode_secret


def sign(keys: Iterable[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: one space-separated ``v1,`` entry per key."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(key, signed, hashlib.sha256)).decode() for key in keys
    )


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """True if any ``v1`` signature in ``headers`` matches ``body`` under ``whsec_`` ``secret``.

    Receivers should prefer the ``standardwebhooks`` package, which also checks the timestamp's age;
    this exists for our own tests and tools.
    """
    key = decode_secret(secret)
    expected = sign([key], headers["webhook-id"], int(headers["webhook-timestamp"]), body)
    for candidate in headers.get("webhook-signature", "").split():
        if hmac.compare_digest(candidate, expected):
            return True
    return False
