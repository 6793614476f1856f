from __future__ import annotations

import base64
import html
import json
from urllib.parse import quote

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


def _forms_of_base64(data: bytes) -> list[str]:
    """``data`` in base64 as encoders write it: both alphabets, with and without padding."""
    forms = [base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode()]
    return list(dict.fromkeys(forms + [form.rstrip("=") for form in forms]))


def _redactor_for(url: str, headers: dict[str, str] | None = None) -> Redactor:
    webhooks = {"A": {"url": url, "headers": headers or {}}}
    return Redactor.from_settings(
        Settings.load(database_url="postgresql://db.example.com/app", webhooks=webhooks)
    )


def test_a_webhook_url_user_name_without_password_is_redacted_as_basic_sends_it() -> None:
    # aiohttp sends "https://tok3n-abc@host/" as "Authorization: Basic base64('tok3n-abc:')".
    redact = _redactor_for("https://tok3n-abc@hooks.example.com/in")
    for form in [
        "tok3n-abc",  # the user name alone, as a receiver decodes it
        "tok3n-abc:",
        *_forms_of_base64(b"tok3n-abc:"),
        *(f"Basic {form}" for form in _forms_of_base64(b"tok3n-abc:")),
    ]:
        text = redact(f'{{"auth": "{form}"}}')
        assert "tok3n" not in text
        assert base64.b64encode(b"tok3n-abc:").decode().rstrip("=") not in text
        assert "[redacted]" in text, form


def test_a_webhook_url_password_is_redacted_in_every_base64_form_basic_may_take() -> None:
    redact = _redactor_for("https://partner:pa55~w0rd%3E%3F@hooks.example.com/in")
    forms = _forms_of_base64(b"partner:pa55~w0rd>?")
    for form in [*forms, forms[0].replace("+", "\\u002B")]:  # .NET's JSON escapes "+"
        assert redact(f"got {form}") == "got [redacted]", form


def test_the_credentials_of_a_configured_basic_header_are_redacted_decoded() -> None:
    basic = base64.b64encode(b"svc-user:Pa55w0rdXyz").decode()
    redact = _redactor_for("https://hooks.example.com/in", {"Authorization": f"Basic {basic}"})
    text = redact("PHP_AUTH_USER=svc-user PHP_AUTH_PW=Pa55w0rdXyz (svc-user:Pa55w0rdXyz)")
    assert text == "PHP_AUTH_USER=svc-user PHP_AUTH_PW=[redacted] ([redacted])"


HEADER_KEY = "KEY/S3CRET+C/xyz=="


@pytest.mark.parametrize(
    "echoed",
    [
        r"KEY\/S3CRET+C\/xyz==",  # PHP's json_encode
        r"KEY/S3CRET\u002BC/xyz\u003D\u003D",  # .NET's System.Text.Json (upper-case hex)
        r"KEY\u002fS3CRET\u002bC\u002fxyz==",
        "KEY%2FS3CRET%2BC%2Fxyz%3D%3D",  # percent-encoded
        "KEY%2fS3CRET%2bC%2fxyz%3d%3d",
        "KEY/S3CRET%2BC/xyz%3D%3D",  # as urllib's quote leaves "/"
        "KEY&#x2F;S3CRET&#43;C&#47;xyz&#61;&#61;",  # an HTML error page's character references
        *_forms_of_base64(HEADER_KEY.encode()),
    ],
)
def test_a_configured_header_value_is_redacted_in_every_form_a_receiver_may_echo(
    echoed: str,
) -> None:
    redact = _redactor_for("https://hooks.example.com/in", {"X-Key": HEADER_KEY})
    assert redact(f'{{"x-key": "{echoed}"}}') == '{"x-key": "[redacted]"}'


def test_a_secret_with_non_ascii_control_or_quote_characters_is_redacted_escaped() -> None:
    value = 'p\u00e4ss\u20ac\U0001f511-\t"q\\9Zk'
    redact = _redactor_for("https://hooks.example.com/in", {"X-Key": value})
    escaped = [
        json.dumps(value)[1:-1],  # \u00e4, \u20ac, \ud83d\udd11, \t, \", \\
        json.dumps(value, ensure_ascii=False)[1:-1],
        json.dumps(value)[1:-1].replace("\\t", "\\u0009").replace("\\u00e4", "\\u00E4"),
        html.escape(value),  # &quot;
        quote(value, safe=""),  # UTF-8, then percent-encoded
    ]
    for echoed in escaped:
        assert redact(f'{{"x-key": "{echoed}"}}') == '{"x-key": "[redacted]"}', echoed


def test_the_parts_of_a_webhook_url_are_redacted_json_escaped_too() -> None:
    redact = _redactor_for("https://hooks.example.com/T000/B000/tokenXYZ?key=abc")
    text = redact(
        r'{"error": "no route https:\/\/hooks.example.com\/T000\/B000\/tokenXYZ?key=abc"}'
    )
    assert "T000" not in text
    assert "tokenXYZ" not in text


def test_encoded_forms_of_short_or_common_header_values_stay_readable() -> None:
    # Raw, a configured value is hidden whatever it is; its encodings only if it is token-like:
    # "application\/json" is in every echo of the request PHP writes, "Z29sZA" may be anything.
    redact = _redactor_for(
        "https://hooks.example.com/in",
        {"X-Key": HEADER_KEY, "Accept": "application/json", "X-Tier": "gold"},
    )
    text = r'{"accept": "application\/json", "tier": "Z29sZA", "key": "KEY\/S3CRET+C\/xyz=="}'
    expected = r'{"accept": "application\/json", "tier": "Z29sZA", "key": "[redacted]"}'
    assert redact(text) == expected
