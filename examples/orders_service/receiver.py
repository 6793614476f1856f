"""The partner's side: verify a webhook and ship the order it announces."""

from __future__ import annotations

from collections.abc import Mapping

from outbox import inbox

# The example's shared secret (a real one comes from your settings or Key Vault).
SECRET = "whsec_c2VydmljZS1hbmQtcGFydG5lci1zaGFyZWQta2V5"  # noqa: S105


def handle(body: bytes, headers: Mapping[str, str]) -> tuple[int, str]:
    """The status to answer, and what was done."""
    try:
        event = inbox.verify(body, headers, SECRET)
    except inbox.InvalidSignature:
        return 401, "refused"
    return 204, f"shipping order {event.data['orderId']} to {event.data['customer']}"
