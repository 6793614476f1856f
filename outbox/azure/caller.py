"""Who calls an HTTP function: the name the record of actions gives them, where they call from,
with what, and whether they may act.

- On Azure the Functions host has checked a function key before the function runs, and says
  nothing of which: the caller may act, and is named by App Service Authentication's headers
  where it is on (``X-MS-CLIENT-PRINCIPAL-NAME``, else the name claim of the decoded
  ``X-MS-CLIENT-PRINCIPAL``), otherwise ``function key``.
- ``outbox serve`` checks its keys itself and says which one matched (``checked_key``, set for
  the call): the key's name is the caller's, and a viewer's key may not act. Principal headers
  are not taken there: no App Service Authentication stands in front to set them.

The address is the first of ``X-Forwarded-For`` (else the one the host saw), the user agent
``User-Agent`` bounded to ``MAX_USER_AGENT_CHARS``: both are what the caller says, hostile text,
escaped wherever they are shown.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from outbox.core.errors import BadRequestError
from outbox.core.settings import FUNCTION_KEY_NAME
from outbox.operations.actions import Actor

KEY_PARAMETER = "code"
MAX_USER_AGENT_CHARS = 200
MAX_ADDRESS_CHARS = 100
MAX_NAME_CHARS = 200
KEY_IN_ADDRESS = "send the key in the x-functions-key header, not in the address"
# The claim types that name a principal, after the principal's own name_typ.
NAME_CLAIMS = (
    "name",
    "preferred_username",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name",
    "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress",
)
_PORT = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){3}):\d+$|^\[([0-9A-Fa-f:.]+)\](?::\d+)?$")


@dataclass(frozen=True, slots=True)
class CheckedKey:
    """A key a host checked itself (``outbox serve``): its name, whether it may act, and the
    address the request came from."""

    name: str
    can_act: bool
    address: str | None = None


# Set by a host that checks the keys itself, for the one call it makes; unset on Azure.
checked_key: ContextVar[CheckedKey | None] = ContextVar("outbox_checked_key", default=None)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request came from (``of``)."""

    name: str
    address: str | None = None
    user_agent: str | None = None
    can_act: bool = True
    key_in_address: bool = False  # the key came as ?code=

    @property
    def actor(self) -> Actor:
        """The caller as the record of actions names them."""
        return Actor(self.name, self.address, self.user_agent)

    def acting(self) -> Actor:
        """The caller of an acting route: its key must not have come in the address (an address
        is logged by proxies and kept in browsers' histories), a 400 otherwise."""
        if self.key_in_address:
            raise BadRequestError(KEY_IN_ADDRESS)
        return self.actor


def of(headers: Mapping[str, str], query: Sequence[tuple[str, str]] = ()) -> Caller:
    """The caller of a request with ``headers`` and ``query`` (its query string's pairs)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    checked = checked_key.get()
    if checked is not None:
        name, can_act, seen = checked.name, checked.can_act, checked.address
    else:
        name, can_act, seen = principal(lowered) or FUNCTION_KEY_NAME, True, None
    agent = lowered.get("user-agent")
    return Caller(
        name=name,
        address=forwarded_for(lowered.get("x-forwarded-for")) or seen,
        user_agent=agent[:MAX_USER_AGENT_CHARS] if agent else None,
        can_act=can_act,
        key_in_address=any(key == KEY_PARAMETER for key, _ in query),
    )


def principal(headers: Mapping[str, str]) -> str | None:
    """The name App Service Authentication gives the signed-in principal (lower-cased
    ``headers``), if any."""
    named = headers.get("x-ms-client-principal-name", "").strip()
    if named:
        return named[:MAX_NAME_CHARS]
    encoded = headers.get("x-ms-client-principal", "")
    if not encoded:
        return None
    try:
        decoded = json.loads(base64.b64decode(encoded, validate=False))
    except (binascii.Error, ValueError, RecursionError):
        return None
    claims = decoded.get("claims") if isinstance(decoded, dict) else None
    if not isinstance(claims, list):
        return None
    wanted = (decoded.get("name_typ"), *NAME_CLAIMS)
    values = {c.get("typ"): c.get("val") for c in claims if isinstance(c, dict)}
    for claim in wanted:
        value = values.get(claim)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_NAME_CHARS]
    return None


def forwarded_for(header: str | None) -> str | None:
    """The first address of an ``X-Forwarded-For`` (the client's, as the first proxy heard it),
    without a port (Azure's front ends add one)."""
    if not header:
        return None
    first = header.split(",", 1)[0].strip()[:MAX_ADDRESS_CHARS]
    match = _PORT.match(first)
    if match:
        first = match.group(1) or match.group(2)
    return first or None
