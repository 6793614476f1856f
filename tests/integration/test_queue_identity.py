"""Identity-based wake-up queue: the hint clients (async and sync) and ``serve``'s queue listener
with ``AzureWebJobsStorage__queueServiceUri`` (+ ``__credential``, ``__clientId``) and a token.

Against an Azurite that checks OAuth tokens (``--oauth basic``, over HTTPS with a certificate made
here): their audience, issuer and lifetime, not their signature. Entra cannot run here: stand-ins
for azure-identity's credentials hand out such tokens (the one mock); everything else is real.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import azure.functions as func
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ResourceExistsError

from outbox.core.settings import QueueSettings
from outbox.hosting.serve import Binding, QueueListener, QueueOptions
from outbox.transport import sync_wakeup, wakeup
from tests.support.azurite import Azurite
from tests.support.tls import self_signed_certificate

CLIENT_ID = "11111111-2222-3333-4444-555555555555"
TENANT = "00000000-0000-0000-0000-0000000000aa"


def jwt(*, audience: str = "https://storage.azure.com", lifetime: float = 3600) -> str:
    """A token Azurite's basic OAuth accepts (it reads the claims, never the signature)."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    now = int(time.time())
    claims = {
        "aud": audience,
        "iss": f"https://sts.windows.net/{TENANT}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": int(now + lifetime),
        "oid": CLIENT_ID,
    }
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


class Issued:
    """What the stand-in credentials were made with, and the token they hand out."""

    made: ClassVar[list[tuple[str, dict[str, Any]]]] = []
    token: ClassVar[str] = ""


def credential_classes(asynchronous: bool) -> types.ModuleType:
    """An ``azure.identity`` (or ``.aio``) module whose credentials hand out ``Issued.token``."""

    class Credential:
        def __init__(self, **kwargs: Any) -> None:
            Issued.made.append((type(self).__name__, kwargs))

        def _token(self) -> AccessToken:
            return AccessToken(Issued.token, int(time.time()) + 3600)

        def close(self) -> None:
            pass

        def __enter__(self) -> Credential:
            return self

        def __exit__(self, *args: object) -> None:
            pass

    class SyncManagedIdentityCredential(Credential):
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return self._token()

    class AsyncCredential(Credential):
        async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return self._token()

        async def close(self) -> None:  # type: ignore[override]
            pass

    base = AsyncCredential if asynchronous else SyncManagedIdentityCredential
    module = types.ModuleType("azure.identity.aio" if asynchronous else "azure.identity")
    module.ManagedIdentityCredential = type("ManagedIdentityCredential", (base,), {})  # type: ignore[attr-defined]
    module.DefaultAzureCredential = type("DefaultAzureCredential", (base,), {})  # type: ignore[attr-defined]
    return module


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("azurite-tls"))
    azurite = Azurite(tls=(cert, key)).start()
    yield azurite
    azurite.stop()


@pytest.fixture
def identity(oauth_azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> QueueSettings:
    """Settings as the template sets them; the stand-in credentials in azure-identity's place;
    the test's certificate trusted by the clients (the SDK's ``connection_verify``: a CA file)."""
    assert oauth_azurite.tls is not None
    monkeypatch.setitem(wakeup.CLIENT_OPTIONS, "connection_verify", str(oauth_azurite.tls[0]))
    monkeypatch.setitem(sys.modules, "azure.identity.aio", credential_classes(asynchronous=True))
    monkeypatch.setitem(sys.modules, "azure.identity", credential_classes(asynchronous=False))
    monkeypatch.setattr(Issued, "made", [])
    monkeypatch.setattr(Issued, "token", jwt())
    for name in ("AzureWebJobsStorage", "AzureWebJobsStorage__accountName"):
        monkeypatch.delenv(name, raising=False)
    return QueueSettings(
        queue_service_uri=oauth_azurite.queue_service_uri,
        queue_credential="managedidentity",
        queue_client_id=CLIENT_ID,
        queue_name=f"hints-{time.time_ns() % 10**9}",
    )


async def peek(settings: QueueSettings) -> list[str]:
    async with wakeup.WakeUpQueue.from_settings(settings) as queue:
        messages = await queue.client.peek_messages(max_messages=32)
    return [json.loads(m.content)["requestedAt"] for m in messages]


async def test_the_async_hint_client_signs_in_as_the_user_assigned_identity(
    identity: QueueSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert await wakeup.notify_once(identity) is True
    assert len(await peek(identity)) == 1
    assert ("ManagedIdentityCredential", {"client_id": CLIENT_ID}) in Issued.made
    assert Issued.token not in caplog.text


async def test_the_sync_hint_client_signs_in_as_the_user_assigned_identity(
    identity: QueueSettings,
) -> None:
    assert await asyncio.to_thread(sync_wakeup.notify_once, identity) is True
    assert len(await peek(identity)) == 1
    assert ("ManagedIdentityCredential", {"client_id": CLIENT_ID}) in Issued.made


async def test_without_credential_setting_it_is_default_azure_credential(
    identity: QueueSettings,
) -> None:
    settings = identity.model_copy(update={"queue_credential": None, "queue_client_id": None})
    assert await wakeup.notify_once(settings) is True
    assert {name for name, _ in Issued.made} == {"DefaultAzureCredential"}


async def test_a_token_azurite_refuses_is_a_lost_hint_logged_without_the_token(
    identity: QueueSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """What makes the tests above prove something: the emulator checks the token."""
    caplog.set_level(logging.DEBUG)
    Issued.token = jwt(lifetime=-600)  # expired ten minutes ago
    assert await wakeup.notify_once(identity) is False
    assert "outbox wake-up hint not sent" in caplog.text
    assert Issued.token not in caplog.text
    Issued.token = jwt(audience="https://vault.azure.net")  # a token for another service
    assert await wakeup.notify_once(identity) is False


def test_an_unknown_credential_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="must be managedidentity"):
        QueueSettings(queue_service_uri="https://a.queue.core.windows.net", queue_credential="key")


async def test_serve_s_queue_listener_takes_hints_through_the_identity(
    identity: QueueSettings, tmp_path: Path
) -> None:
    seen: list[bytes] = []

    async def function(message: func.QueueMessage) -> None:
        seen.append(message.get_body())

    binding = Binding("outbox_queue", {"queueName": identity.queue_name}, function)
    listener = QueueListener(
        binding,
        identity,
        QueueOptions(max_polling_interval=0.2, visibility_timeout=1, function_timeout=5),
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(listener.run(stopping))
    try:
        sender = wakeup.make_queue_client(identity)
        async with sender:
            with contextlib.suppress(ResourceExistsError):  # the listener may have made it
                await sender.create_queue()
            await sender.send_message(wakeup.hint_message())
        for _ in range(300):
            if seen or task.done():
                break
            await asyncio.sleep(0.1)
        assert not task.done(), task
        assert len(seen) == 1
        assert "requestedAt" in json.loads(seen[0])
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)
        await listener.close()
    assert ("ManagedIdentityCredential", {"client_id": CLIENT_ID}) in Issued.made
