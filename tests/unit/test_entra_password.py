"""outbox.entra's password: which credential, when a token is fetched again, what settings allow."""

from __future__ import annotations

import sys

import pytest
from azure.core.credentials import AccessToken
from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

from outbox.core.errors import ConfigurationError
from outbox.core.settings import DatabaseSettings, Settings
from outbox.store import entra
from tests.support.fake_entra import FakeCredential

URL = "postgresql://app-identity@server.postgres.database.azure.com/outbox?sslmode=require"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class DatedCredential:
    """Tokens whose expiry is on ``clock``: ``(token, seconds left)`` in turn."""

    def __init__(self, clock: Clock, tokens: list[tuple[str, float]]) -> None:
        self.clock, self.tokens = clock, tokens
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        self.scopes.append(scopes)
        token, left = self.tokens.pop(0)
        return AccessToken(token, int(self.clock.now + left))


def test_a_token_is_kept_until_less_than_the_margin_is_left() -> None:
    clock = Clock()
    credential = DatedCredential(clock, [("one", 3600), ("two", 3600)])
    password = entra.EntraPassword(credential, clock=clock)
    assert password.sync() == "one"
    clock.now += 3600 - entra.REFRESH_MARGIN_SECONDS - 1  # 301 s left: kept
    assert password.sync() == "one"
    assert len(credential.scopes) == 1
    clock.now += 2  # 299 s left: fetched again
    assert password.sync() == "two"
    assert credential.scopes == [(entra.SCOPE,), (entra.SCOPE,)]


def test_a_client_id_chooses_that_user_assigned_identity() -> None:
    assert isinstance(
        entra.default_credential("00000000-1111-2222-3333-444444444444"), ManagedIdentityCredential
    )
    assert isinstance(entra.default_credential(None), DefaultAzureCredential)


def test_the_settings_choose_the_password_once_per_client_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(entra, "_shared", {})
    made: list[str | None] = []

    def fake(client_id: str | None = None) -> FakeCredential:
        made.append(client_id)
        return FakeCredential([("t", 3600.0)])

    monkeypatch.setattr(entra, "default_credential", fake)
    assert entra.for_settings(Settings.load(database_url=URL)) is None  # password: the URL's
    chosen = Settings.load(database_url=URL, database_auth="entra", database_client_id="abc")
    first = entra.for_settings(chosen)
    assert first is not None
    assert entra.for_settings(chosen) is first
    inbox = DatabaseSettings(database_url=URL, database_auth="entra")  # type: ignore[call-arg]
    assert entra.for_settings(inbox) is not first
    assert made == ["abc", None]


@pytest.mark.parametrize("kind", [Settings, DatabaseSettings])
def test_entra_with_a_password_in_the_url_is_refused(
    kind: type[Settings] | type[DatabaseSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql://app:hunter2@db/outbox")
    monkeypatch.setenv("OUTBOX_DATABASE_AUTH", "entra")
    with pytest.raises(ConfigurationError) as caught:
        kind.load()
    assert "OUTBOX_DATABASE_URL must hold no password when OUTBOX_DATABASE_AUTH is entra" in str(
        caught.value
    )
    assert "hunter2" not in str(caught.value)


def test_an_unknown_database_auth_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", URL)
    monkeypatch.setenv("OUTBOX_DATABASE_AUTH", "kerberos")
    with pytest.raises(ConfigurationError, match="OUTBOX_DATABASE_AUTH"):
        Settings.load()


def test_without_azure_identity_it_says_which_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)
    with pytest.raises(ConfigurationError, match=r"outbox-relay\[azure\]"):
        entra.default_credential()
