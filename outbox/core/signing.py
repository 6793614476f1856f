"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping

from outbox.core.settings import decode_secret


class Signer:
    """Signs with each of a set of keys (several during a rotation; none: unsigned).

    Each key's HMAC state is prepared once and copied per message, rather than set up again.
    """

    def __init__(self, keys: Iterable[bytes]) -> None:
        self._prepared = tuple(hmac.new(key, digestmod=hashlib.sha256) for key in keys)

    def __bool__(self) -> bool:
        return bool(self._prepared)

    def sign(self, message_id: str, timestamp: int, body: bytes) -> str:
        """The ``webhook-signature`` header value: one space-separated ``v1,`` entry per key."""
        prefix = f"{message_id}.{timestamp}.".encode()
        entries = []
        for prepared in self._prepared:
            mac = prepared.copy()
            mac.update(prefix)
            mac.update(body)
            entries.append("v1," + base64.b64encode(mac.digest()).decode())
        return " ".join(entries)


def sign(keys: Iterable[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for ``keys``: one ``v1,`` entry per key."""
    return Signer(keys).sign(message_id, timestamp, body)


def matches(
    keys: Iterable[bytes], message_id: str, timestamp: int, body: bytes, header: str
) -> bool:
    """Whether any ``v1`` entry of the ``webhook-signature`` ``header`` is the signature of the
    message under one of ``keys``. Each comparison takes constant time (``hmac.compare_digest``)."""
    expected = Signer(keys).sign(message_id, timestamp, body).split()
    for candidate in header.split():
        if not candidate.isascii():  # a signature is base64; compare_digest refuses other text
            continue
        if any(hmac.compare_digest(candidate, signature) for signature in expected):
            return True
    return False


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """True if any ``v1`` signature in ``headers`` matches ``body`` under ``whsec_`` ``secret``.

    It checks neither the timestamp's age nor the headers' case: receivers use
    ``outbox.inbox.verify``, which does; this exists for our own tests and tools.
    """
    key = decode_secret(secret)
    return matches(
        [key],
        headers["webhook-id"],
        int(headers["webhook-timestamp"]),
        body,
        headers.get("webhook-signature", ""),
    )
