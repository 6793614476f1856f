"""A stand-in for azure-identity's credentials (Microsoft Entra cannot run here): the one mock of
the passwordless tests. The server it signs in to, and everything else, is real.

``python -m tests.support.fake_entra ARGS...`` runs ``python -m outbox ARGS...`` with
``outbox.store.entra.default_credential`` giving a ``FakeCredential``: its token is
``FAKE_ENTRA_TOKEN``, or, with ``FAKE_ENTRA_ERROR`` set, it fails with that message.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

HOUR = 3600.0


class FakeCredential:
    """Hands out ``tokens`` in turn (the last one again and again), each ``(token, seconds
    left)``; or raises ``error``. Counts its calls and the scopes asked for."""

    def __init__(
        self, tokens: list[tuple[str, float]] | None = None, error: Exception | None = None
    ) -> None:
        self.tokens = list(tokens or [])
        self.error = error
        self.scopes: list[tuple[str, ...]] = []

    @property
    def calls(self) -> int:
        return len(self.scopes)

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        if self.error is not None:
            raise self.error
        token, left = self.tokens.pop(0) if len(self.tokens) > 1 else self.tokens[0]
        return AccessToken(token, int(time.time() + left))


def main() -> int:
    from outbox.hosting import cli
    from outbox.store import entra

    error = os.environ.get("FAKE_ENTRA_ERROR")
    credential = FakeCredential(
        [(os.environ.get("FAKE_ENTRA_TOKEN", ""), HOUR)],
        ClientAuthenticationError(error) if error else None,
    )
    entra.default_credential = lambda client_id=None: credential  # type: ignore[assignment]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
