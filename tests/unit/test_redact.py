from __future__ import annotations

import pytest

from outbox.core.redact import Redactor
from outbox.core.settings import Settings

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def settings() -> Settings:
    return Settings.load(
        database_url="postgresql://relay:db-pass-123@db.example.com/app",
        webhooks={
            "A": {"url": "https://hooks.example.com/T000/B000/tokenXYZ?key=abc", "secret": SECRET}
        },
        queue_connection="DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=S3cr3tKey==;",
    )


def test_configured_secrets_are_replaced_everywhere_in_a_text() -> None:
    redact = Redactor.from_settings(settings())
    text = redact(
        f"failed: {SECRET} to https://hooks.example.com/T000/B000/tokenXYZ?key=abc "
        "db postgresql://relay:db-pass-123@db.example.com/app; AccountKey=S3cr3tKey==;"
    )
    for leak in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "tokenXYZ", "db-pass-123", "S3cr3tKey"):
        assert leak not in text
    assert text.count("[redacted]") >= 4


def test_credential_shapes_are_redacted_even_when_not_configured() -> None:
    redact = Redactor([])
    assert redact("AccountKey=abc123;AccountName=x") == "AccountKey=[redacted];AccountName=x"
    assert redact("see https://user:pw@host/path") == "see https://user:[redacted]@host/path"
    assert redact("sig=abcdef&se=2026") == "sig=[redacted]&se=2026"


def test_text_without_secrets_is_unchanged() -> None:
    assert (
        Redactor.from_settings(settings())("HTTP 500: internal error") == "HTTP 500: internal error"
    )


def test_a_webhook_url_is_redacted_as_the_http_client_prints_it_too() -> None:
    # Logic Apps URLs carry "sp=%2Ftriggers%2F…" and a signature; yarl prints "%2F" as "/".
    url = "https://prod.logic.azure.com/workflows/w1/invoke?sp=%2Ftriggers%2Fmanual&sig=tok3n"
    redact = Redactor.from_settings(
        Settings.load(database_url="postgresql://db.example.com/app", webhooks={"A": {"url": url}})
    )
    printed = "https://prod.logic.azure.com/workflows/w1/invoke?sp=/triggers/manual&sig=tok3n"
    text = redact(f"ClientResponseError: 400, url='{printed}'")
    assert "tok3n" not in text
    assert "/workflows/w1/invoke" not in text


def test_parts_of_a_webhook_url_a_receiver_may_echo_are_redacted_too() -> None:
    url = "http://h.example/express/hooks/PATHtok3nSecret?sig=qs&key=QUERYt0kenSecret&n=TOK%2Bsecret123"
    redact = Redactor.from_settings(
        Settings.load(database_url="postgresql://db.example.com/app", webhooks={"A": {"url": url}})
    )
    for echoed in (
        "<pre>Cannot POST /express/hooks/PATHtok3nSecret</pre>",  # the path alone (Express)
        '{"error": "invalid api key QUERYt0kenSecret"}',  # one query value
        "token TOK+secret123 expired",  # a query value as the receiver decoded it
    ):
        text = redact(echoed)
        assert "PATHtok3nSecret" not in text
        assert "QUERYt0kenSecret" not in text
        assert "TOK+secret123" not in text
    assert redact("HTTP 500: internal error at /express") == "HTTP 500: internal error at /express"


def test_a_token_like_host_label_is_redacted_where_errors_quote_the_host() -> None:
    url = "https://eo5f1c2a9b8d7e6.m.pipedream.net/"
    redact = Redactor.from_settings(
        Settings.load(database_url="postgresql://db.example.com/app", webhooks={"A": {"url": url}})
    )
    error = (
        "ClientConnectorDNSError: Cannot connect to host eo5f1c2a9b8d7e6.m.pipedream.net:443 "
        "ssl:default [Name or service not known]"
    )
    assert "eo5f1c2a9b8d7e6" not in redact(error)
    assert "[redacted].m.pipedream.net:443" in redact(error)
    assert redact("EO5F1C2A9B8D7E6 in capitals") == "[redacted] in capitals"
    # Only that whole label: a longer word that contains it is something else.
    assert redact("eo5f1c2a9b8d7e6x") == "eo5f1c2a9b8d7e6x"


@pytest.mark.parametrize(
    ("url", "text"),
    [
        # A region names the service, it is no secret; nor is a host name like "service1".
        (
            "https://vxbbyw5p.lambda-url.us-east-1.on.aws/",
            "HTTP 502: upstream in us-east-1 unavailable",
        ),
        ("https://service1.example.com/in", "HTTP 503: service10 unavailable (service1 draining)"),
        ("http://[2001:db8::10]:8080/in", "Cannot connect to host [2001:db8::10]:8080"),
        ("https://hooks.example.com/in", "host hooks.example.com:443"),
        ("https://abcdef123456789.com/in", "host abcdef123456789.com:443"),
    ],
)
def test_host_names_that_are_not_capabilities_stay_readable(url: str, text: str) -> None:
    redact = Redactor.from_settings(
        Settings.load(database_url="postgresql://db.example.com/app", webhooks={"A": {"url": url}})
    )
    assert redact(text) == text
