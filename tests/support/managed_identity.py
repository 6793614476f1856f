"""A stand-in for the managed identity endpoint Azure gives a function app (App Service's
protocol: ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER``), which azure-identity's real
``ManagedIdentityCredential`` calls: the one part of Microsoft Entra the deployment test cannot
have. It hands out a token per resource and records who asked for what.

The tokens are what each stand-in service checks: a JWT Azurite's basic OAuth accepts for
storage, the PostgreSQL role's password for the database, a bearer string for the Application
Insights stand-in.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TENANT = "00000000-0000-0000-0000-0000000000aa"
STORAGE = "https://storage.azure.com"
POSTGRES = "https://ossrdbms-aad.database.windows.net"
MONITOR = "https://monitor.azure.com"


def storage_jwt(object_id: str, lifetime: float = 3600) -> str:
    """A token Azurite's basic OAuth accepts (it reads the claims, never the signature)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    now = int(time.time())
    claims = {
        "aud": STORAGE,
        "iss": f"https://sts.windows.net/{TENANT}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": int(now + lifetime),
        "oid": object_id,
    }
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


@dataclass
class Asked:
    resource: str
    client_id: str | None
    header_ok: bool


@dataclass
class IdentityEndpoint:
    """``await IdentityEndpoint(client_id).start()``; its ``environment`` is what the platform
    sets in the app's process."""

    client_id: str
    header: str = field(default_factory=lambda: secrets.token_hex(16))
    tokens: dict[str, str] = field(default_factory=dict)
    asked: list[Asked] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        self.tokens.setdefault(STORAGE, storage_jwt(self.client_id))
        self.tokens.setdefault(POSTGRES, secrets.token_urlsafe(48))
        self.tokens.setdefault(MONITOR, secrets.token_urlsafe(48))

    async def start(self) -> IdentityEndpoint:
        app = web.Application()
        app.router.add_get("/msi/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def environment(self) -> dict[str, str]:
        return {
            "IDENTITY_ENDPOINT": f"http://127.0.0.1:{self.port}/msi/token",
            "IDENTITY_HEADER": self.header,
        }

    def resources_asked(self) -> set[str]:
        return {a.resource for a in self.asked}

    async def _token(self, request: web.Request) -> web.Response:
        resource = request.query.get("resource", "").rstrip("/")
        asked = Asked(
            resource,
            request.query.get("client_id"),
            request.headers.get("X-IDENTITY-HEADER") == self.header,
        )
        self.asked.append(asked)
        if not asked.header_ok:
            return web.json_response({"error": "bad identity header"}, status=401)
        if asked.client_id not in (None, self.client_id):
            return web.json_response({"error": "no such identity on this app"}, status=400)
        if resource not in self.tokens:
            return web.json_response({"error": f"unknown resource {resource}"}, status=400)
        return web.json_response(
            {
                "access_token": self.tokens[resource],
                "expires_on": str(int(time.time()) + 3600),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": self.client_id,
            }
        )
