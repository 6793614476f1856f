from __future__ import annotations

import json
from typing import Any

import pytest

from outbox.core.errors import ConfigurationError
from outbox.core.settings import (
    DEFAULT_QUEUE_NAME,
    QueueSettings,
    Settings,
    default_concurrency,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DB = "postgresql://relay:hunter2-db-password@db.example.com:5432/app"
BAD_PORT = "has a port that is not a number from 1 to 65535"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", DB)
    return monkeypatch


def load_error(**overrides: object) -> str:
    with pytest.raises(ConfigurationError) as info:
        Settings.load(**overrides)
    return str(info.value)


def test_defaults_from_a_minimal_environment(env: pytest.MonkeyPatch) -> None:
    settings = Settings.load()
    assert settings.database_url.get_secret_value() == DB
    assert settings.queue_name == DEFAULT_QUEUE_NAME == "outbox-wakeup"
    assert settings.batch_size == 100
    assert settings.webhooks == {}
    assert settings.queue_connection is None
    assert not settings.has_queue


def test_every_setting_is_read_from_its_documented_name(env: pytest.MonkeyPatch) -> None:
    env.setenv(
        "OUTBOX_WEBHOOKS", json.dumps({"A": {"url": "https://a.example/h", "secret": SECRET}})
    )
    env.setenv("OUTBOX_QUEUE_NAME", "my-hints")
    env.setenv("AzureWebJobsStorage", "UseDevelopmentStorage=true")
    env.setenv("OUTBOX_BATCH_SIZE", "7")
    env.setenv("OUTBOX_LEASE_SECONDS", "45")
    env.setenv("OUTBOX_MAX_ATTEMPTS", "3")
    env.setenv("OUTBOX_HTTP_TIMEOUT_SECONDS", "2.5")
    env.setenv("OUTBOX_CONCURRENCY", "4")
    env.setenv("OUTBOX_RUN_BUDGET_SECONDS", "30")
    settings = Settings.load()
    [endpoint] = settings.endpoints["A"]
    assert (endpoint.name, endpoint.url) == ("A", "https://a.example/h")
    assert len(endpoint.signing_keys) == 1
    assert settings.queue_name == "my-hints"
    assert settings.queue_connection is not None
    assert settings.queue_connection.get_secret_value() == "UseDevelopmentStorage=true"
    assert (settings.batch_size, settings.lease_seconds, settings.max_attempts) == (7, 45, 3)
    assert (settings.http_timeout_seconds, settings.concurrency) == (2.5, 4)
    assert settings.run_budget_seconds == 30


@pytest.mark.parametrize(
    ("sku", "expected"),
    [
        (None, 1024),  # outbox serve, a developer's machine
        ("ElasticPremium", 1024),
        ("PremiumV3", 1024),
        ("Dynamic", 512),  # Consumption: 600 active outbound connections per instance
        (" dynamic ", 512),
        ("FlexConsumption", 512),
    ],
)
def test_concurrency_defaults_to_what_the_hosting_plan_allows(
    env: pytest.MonkeyPatch, sku: str | None, expected: int
) -> None:
    env.delenv("OUTBOX_CONCURRENCY", raising=False)
    if sku is None:
        env.delenv("WEBSITE_SKU", raising=False)
    else:
        env.setenv("WEBSITE_SKU", sku)
    assert default_concurrency(descriptor_limit=65_536) == expected
    assert default_concurrency(descriptor_limit=None) == Settings.load().concurrency
    env.setenv("OUTBOX_CONCURRENCY", "700")  # a value set is taken on any plan
    assert Settings.load().concurrency == 700


@pytest.mark.parametrize(
    ("sku", "descriptors", "expected"),
    [("", 1024, 512), ("", 600, 300), ("Dynamic", 1024, 512), ("Dynamic", 800, 400), ("", 1, 1)],
)
def test_concurrency_defaults_to_at_most_half_the_descriptor_limit(
    sku: str, descriptors: int, expected: int
) -> None:
    # A connection per request in flight; the rest stays for the database, queue and port.
    environ = {"WEBSITE_SKU": sku}
    assert default_concurrency(environ, descriptor_limit=descriptors) == expected


def test_identity_based_queue_connection_counts_as_configured(env: pytest.MonkeyPatch) -> None:
    env.setenv("AzureWebJobsStorage__accountName", "mystorage")
    assert QueueSettings.load().has_queue


def test_missing_database_url_is_named() -> None:
    assert "OUTBOX_DATABASE_URL: is required but not set" in load_error()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("OUTBOX_BATCH_SIZE", "0", "OUTBOX_BATCH_SIZE: Input should be greater than or equal to 1"),
        ("OUTBOX_BATCH_SIZE", "lots", "OUTBOX_BATCH_SIZE: Input should be a valid integer"),
        ("OUTBOX_CONCURRENCY", "100000", "OUTBOX_CONCURRENCY: Input should be less than"),
        ("OUTBOX_MAX_ATTEMPTS", "0", "OUTBOX_MAX_ATTEMPTS: Input should be greater than"),
        ("OUTBOX_HTTP_TIMEOUT_SECONDS", "-1", "OUTBOX_HTTP_TIMEOUT_SECONDS: Input should be"),
        ("OUTBOX_QUEUE_NAME", "Bad_Name", "OUTBOX_QUEUE_NAME: must be a valid Azure Storage queue"),
        ("OUTBOX_WEBHOOKS", "[1]", "OUTBOX_WEBHOOKS: must be a JSON object"),
        ("OUTBOX_WEBHOOKS", "{nope", "OUTBOX_WEBHOOKS: is not valid JSON"),
        ("OUTBOX_LEASE_SECONDS", "5", "OUTBOX_LEASE_SECONDS (5) must be at least"),
    ],
)
def test_bad_values_name_the_setting(
    env: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    env.setenv(name, value)
    assert expected in load_error()


def test_a_bad_database_url_is_rejected_without_echoing_it(env: pytest.MonkeyPatch) -> None:
    env.setenv("OUTBOX_DATABASE_URL", "mysql://root:topsecretpw@db/app")
    message = load_error()
    assert "OUTBOX_DATABASE_URL: must be a postgresql:// URL" in message
    assert "topsecretpw" not in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://root:topsecretpw@127.0.0.1:5432x/db", BAD_PORT),
        ("postgresql://root:topsecretpw@127.0.0.1:99999/db", BAD_PORT),
        ("postgresql://root:topsecretpw@127.0.0.1:0/db", BAD_PORT),
        ("postgresql://root:topsecretpw@h1:5432,h2:7x/db", BAD_PORT),
        ("postgresql://root:topsecretpw@[::1]:70000/db", BAD_PORT),
        ("postgresql://root:topsecretpw@/db?host=h&port=5432x", BAD_PORT),
        ("postgresql://root:topsecretpw@h/db?sslmode=sometimes", "sslmode must be one of"),
        ("postgresql://root:topsecretpw@h/db?sslmode", "has a malformed query string"),
    ],
)
def test_a_database_url_asyncpg_would_refuse_is_rejected_at_load_without_echoing_it(
    env: pytest.MonkeyPatch, url: str, expected: str
) -> None:
    env.setenv("OUTBOX_DATABASE_URL", url)
    message = load_error()
    assert f"OUTBOX_DATABASE_URL: {expected}" in message
    assert "topsecretpw" not in message


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@db.example.com/app",
        "postgres://u:pw@db.example.com:6432/app?sslmode=verify-full",
        "postgresql://u:pw@h1:5432,h2,[::1]:5433/app?sslmode=require",
        "postgresql:///app?host=/var/run/postgresql&port=5433",
    ],
)
def test_database_urls_asyncpg_accepts_load(env: pytest.MonkeyPatch, url: str) -> None:
    env.setenv("OUTBOX_DATABASE_URL", url)
    assert Settings.load().database_url.get_secret_value() == url


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:99999/hooks/T0KEN",
        "http://127.0.0.1:8x/hooks/T0KEN",
        "https://127.0.0.1:0/hooks/T0KEN",
    ],
)
def test_webhook_urls_with_a_bad_port_name_the_event_type_but_never_the_url(
    env: pytest.MonkeyPatch, url: str
) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"OrderCompleted": {"url": url}}))
    message = load_error()
    assert f"OUTBOX_WEBHOOKS['OrderCompleted'].url: url {BAD_PORT}" in message
    assert "T0KEN" not in message
    assert "127.0.0.1" not in message


def test_webhook_urls_aiohttp_cannot_parse_are_rejected_without_echoing_them(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"OrderCompleted": {"url": "https://ü..T0KEN.io/"}}))
    message = load_error()
    assert "OUTBOX_WEBHOOKS['OrderCompleted'].url: url is not a URL that aiohttp can parse" in (
        message
    )
    assert "T0KEN" not in message


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ("c2VjcmV0LXZhbHVlLXRoYXQtbGVha3M=", "each secret must start with 'whsec_'"),
        ("whsec_not*base64*leaky-part", "the part after 'whsec_' must be base64"),
        ("whsec_c2hvcnQ=", "at least 16 bytes"),
        (f"{SECRET} whsec_bad!leaky-part", "must be base64"),
        ("   ", "secret is empty"),
    ],
)
def test_bad_webhook_secrets_name_the_event_type_but_never_the_secret(
    env: pytest.MonkeyPatch, secret: str, expected: str
) -> None:
    env.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps({"OrderCompleted": {"url": "https://x.example", "secret": secret}}),
    )
    message = load_error()
    assert "OUTBOX_WEBHOOKS['OrderCompleted'].secret" in message
    assert expected in message
    for part in secret.split():
        assert part.removeprefix("whsec_") not in message


def test_webhook_json_errors_do_not_echo_the_text(env: pytest.MonkeyPatch) -> None:
    env.setenv("OUTBOX_WEBHOOKS", '{"A": {"url": "https://x", "secret": "whsec_leakyleaky"')
    message = load_error()
    assert "leakyleaky" not in message
    assert "line 1 column" in message


@pytest.mark.parametrize("url", ["ftp://x.example/h", "/relative", "https://", "not a url"])
def test_webhook_urls_must_be_absolute_http(env: pytest.MonkeyPatch, url: str) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"A": {"url": url}}))
    assert (
        "OUTBOX_WEBHOOKS['A'].url: url must be an absolute http:// or https:// URL" in load_error()
    )


def test_unknown_endpoint_keys_are_rejected(env: pytest.MonkeyPatch) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"A": {"url": "https://x.example", "secert": SECRET}}))
    message = load_error()
    assert "OUTBOX_WEBHOOKS['A'].secert: Extra inputs are not permitted" in message
    assert SECRET not in message


def test_rotation_accepts_several_space_separated_secrets(env: pytest.MonkeyPatch) -> None:
    other = "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    env.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps({"A": {"url": "https://x.example", "secret": f"{SECRET} {other}"}}),
    )
    [endpoint] = Settings.load().endpoints["A"]
    assert len(endpoint.signing_keys) == 2


def test_settings_repr_hides_secrets(env: pytest.MonkeyPatch) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"A": {"url": "https://x.example", "secret": SECRET}}))
    env.setenv("AzureWebJobsStorage", "AccountName=a;AccountKey=c3VwZXJzZWNyZXQ=")
    text = repr(Settings.load())
    assert "hunter2" not in text
    assert SECRET not in text
    assert "c3VwZXJzZWNyZXQ=" not in text


@pytest.mark.parametrize("value", ["inf", "1e999", "nan"])
def test_a_duration_setting_must_be_a_finite_number(env: pytest.MonkeyPatch, value: str) -> None:
    # An infinite alert threshold would silently switch alerting off (and print as Infinity).
    env.setenv("OUTBOX_ALERT_OLDEST_PENDING_SECONDS", value)
    assert "OUTBOX_ALERT_OLDEST_PENDING_SECONDS" in load_error()


def test_a_malformed_storage_connection_string_is_a_configuration_error() -> None:
    from outbox.transport.wakeup import make_queue_client

    settings = QueueSettings.load(queue_connection="AccountKey=s3cr3t;garbage")
    with pytest.raises(ConfigurationError, match="AzureWebJobsStorage") as info:
        make_queue_client(settings)
    assert "s3cr3t" not in str(info.value)


def test_a_url_the_parser_cannot_read_is_refused_without_quoting_it(
    env: pytest.MonkeyPatch,
) -> None:
    # urlsplit's own message quotes the part in brackets: here, a piece of the password.
    env.setenv("OUTBOX_DATABASE_URL", "postgresql://outbox:Xk9[pQ7zR2]mW4@db.example.com/outbox")
    env.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps({"OrderCompleted": {"url": "https://hook:Pw[Sk_live_42]@hooks.example.com/in"}}),
    )
    error = load_error()
    assert "OUTBOX_DATABASE_URL: is not a valid URL" in error
    assert "OUTBOX_WEBHOOKS['OrderCompleted'].url: url is not a valid URL" in error
    assert "pQ7zR2" not in error
    assert "Sk_live_42" not in error


def test_keys_of_the_webhooks_setting_are_named_only_when_they_look_like_names(
    env: pytest.MonkeyPatch,
) -> None:
    # A mapping written backwards, or a URL where a field name belongs: never echo them.
    env.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps(
            {
                "https://hooks.slack.com/services/T0/B0/xoxbSecret": "OrderCompleted",
                "OrderShipped": {"https://hooks.example.com/in/PathToken42": SECRET},
            }
        ),
    )
    error = load_error()
    assert "xoxbSecret" not in error
    assert "PathToken42" not in error
    assert "OUTBOX_WEBHOOKS[<not shown>]" in error
    assert "OUTBOX_WEBHOOKS['OrderShipped'].<not shown>: Extra inputs are not permitted" in error


def test_an_empty_value_is_called_empty(env: pytest.MonkeyPatch) -> None:
    env.setenv("OUTBOX_FAILED_RETENTION_DAYS", "")
    assert "OUTBOX_FAILED_RETENTION_DAYS: is set but empty" in load_error()


@pytest.mark.parametrize(
    ("lease", "timeout", "allowed"),
    [("3.001", "2", False), ("4.99", "2", False), ("5", "2", True), ("21", "10", True)],
)
def test_a_lease_must_leave_a_delivery_a_real_margin(
    env: pytest.MonkeyPatch, lease: str, timeout: str, allowed: bool
) -> None:
    env.setenv("OUTBOX_LEASE_SECONDS", lease)
    env.setenv("OUTBOX_HTTP_TIMEOUT_SECONDS", timeout)
    if allowed:
        assert Settings.load().lease_seconds == float(lease)
    else:
        # The rule and the minimum, so the fix is plain.
        assert (
            f"OUTBOX_LEASE_SECONDS ({lease}) must be at least 2 * OUTBOX_HTTP_TIMEOUT_SECONDS + 1"
            f" = 5:" in load_error()
        )


@pytest.mark.parametrize(
    "key",
    [
        SECRET,  # a webhook secret used as an event type by mistake
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "sk_live_51H8aBcDeFgHiJkLmN",
        "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ],
)
def test_a_key_that_looks_like_a_secret_is_never_quoted(env: pytest.MonkeyPatch, key: str) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({key: {"url": 5}}))
    error = load_error()
    assert key not in error
    assert key.removeprefix("whsec_") not in error
    assert "OUTBOX_WEBHOOKS[<not shown>].url" in error


@pytest.mark.parametrize(
    "key", ["OrderCompleted", "order.completed.v2", "OrderCompleted2024", "invoice-paid", "A1"]
)
def test_a_key_that_looks_like_an_event_type_is_named(env: pytest.MonkeyPatch, key: str) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({key: {"url": 5}}))
    assert f"OUTBOX_WEBHOOKS[{key!r}].url" in load_error()


def test_an_event_type_may_have_several_named_endpoints_with_headers_and_limits(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv(
        "OUTBOX_WEBHOOKS",
        json.dumps(
            {
                "OrderCompleted": [
                    {"name": "billing", "url": "https://billing.example/h", "secret": SECRET},
                    {
                        "name": "shipping",
                        "url": "https://ship.example/in",
                        "headers": {"Authorization": "Bearer abcdefgh12345678"},
                        "timeout_seconds": 3,
                        "max_concurrency": 4,
                        "final_statuses": [400, 422],
                    },
                ],
                "InvoicePaid": {"url": "https://erp.example/i"},
            }
        ),
    )
    settings = Settings.load()
    billing, shipping = settings.endpoints["OrderCompleted"]
    assert (billing.name, shipping.name) == ("billing", "shipping")
    assert shipping.headers["Authorization"].get_secret_value() == "Bearer abcdefgh12345678"
    assert (shipping.timeout(10), billing.timeout(10)) == (3, 10)
    assert (shipping.max_concurrency, shipping.final_statuses) == (4, (400, 422))
    [invoice] = settings.endpoints["InvoicePaid"]
    assert invoice.name == "InvoicePaid"  # a single endpoint is named after its event type
    assert "abcdefgh12345678" not in repr(settings)


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        (
            {"url": "https://x.example", "headers": {"Webhook-Signature": "v1,forged"}},
            "OUTBOX_WEBHOOKS['A'].headers: header Webhook-Signature is the relay's own",
        ),
        (
            [{"name": "a", "url": "https://x.example", "headers": {"traceparent": "00-x"}}],
            "OUTBOX_WEBHOOKS['A'][0].headers: header traceparent is the relay's own",
        ),
        (
            {"url": "https://x.example", "headers": {"X-Key": "one\r\nX-Injected: two"}},
            "header X-Key's value holds a line break or NUL",
        ),
        (
            [{"url": "https://x.example"}],
            "OUTBOX_WEBHOOKS: ['A']: each endpoint of a list needs a name",
        ),
        (
            [{"name": "a", "url": "https://x.example"}, {"name": "a", "url": "https://y.example"}],
            "endpoint names must be unique within an event type",
        ),
        ([], "a list of endpoints must not be empty"),
        ([{"name": "a b", "url": "https://x.example"}], "OUTBOX_WEBHOOKS['A'][0].name: "),
        ({"url": "https://x.example", "final_statuses": [200]}, "final_statuses must be HTTP"),
        ({"url": "https://x.example", "max_concurrency": 0}, "['A'].max_concurrency: "),
        (
            {"url": "https://x.example", "timeout_seconds": 40},
            "OUTBOX_LEASE_SECONDS (60) must be at least 2 * the longest timeout_seconds of "
            "OUTBOX_WEBHOOKS + 1 = 81",
        ),
        ({"url": "https://x.example", "colour": "red"}, "['A'].colour: Extra inputs"),
    ],
)
def test_a_bad_endpoint_is_refused_with_a_message_that_names_where(
    env: pytest.MonkeyPatch, endpoints: Any, expected: str
) -> None:
    env.setenv("OUTBOX_WEBHOOKS", json.dumps({"A": endpoints}))
    error = load_error()
    assert expected.replace("Value error, ", "") in error
    assert "forged" not in error
    assert "X-Injected" not in error
