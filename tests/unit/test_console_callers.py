"""Who calls the console and what they may ask for, checked without services: the named keys'
settings (never echoed), the caller a request names (App Service Authentication's principal,
the address, the user agent, a key in the address), the record of actions' query string and
the message list's cursor."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from outbox.azure import caller
from outbox.core.errors import BadRequestError, ConfigurationError
from outbox.core.redact import Redactor, shown_host
from outbox.core.settings import Settings
from outbox.operations.list_query import (
    ActionQuery,
    action_cursor,
    parse_action_query,
    parse_message_query,
)

URL = "postgresql://relay:pw@127.0.0.1:5432/outbox"
ALICE = "alice-acts-key-0123456789"
BOB = "bob-reads-key-0123456789"
SECRET_NAME = "Zq8u2RkWq0PbX7Lm9aQeT4"  # a key given where a name belongs


def test_named_console_keys_are_read_as_name_to_key_and_hidden_everywhere() -> None:
    settings = Settings.load(
        database_url=URL,
        function_key="the-function-key-0123",
        console_keys=json.dumps({"alice": ALICE}),
        console_view_keys=json.dumps({"bob@example.com": BOB}),
    )
    assert {name: key.get_secret_value() for name, key in settings.all_keys().items()} == {
        ("function key", True): "the-function-key-0123",
        ("alice", True): ALICE,
        ("bob@example.com", False): BOB,
    }
    assert ALICE not in repr(settings)
    redact = Redactor.from_settings(settings)
    assert redact(f"saw {ALICE} and {BOB}") == "saw [redacted] and [redacted]"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"console_keys": '{"alice": "' + ALICE}, "OUTBOX_CONSOLE_KEYS: is not valid JSON"),
        ({"console_keys": '["' + ALICE + '"]'}, "must be a JSON object of names and keys"),
        ({"console_keys": '{"alice": "short-' + ALICE[:4] + '"}'}, "at least 16 characters"),
        ({"console_keys": '{"a b": "' + ALICE + '"}'}, "a name is 1 to 64 letters"),
        ({"console_keys": '{"' + SECRET_NAME + '": "' + BOB + '"}'}, "<not shown>"),
        (
            {"console_keys": '{"alice": "' + ALICE + '"}', "function_key": ALICE},
            "must differ from the others",
        ),
        (
            {
                "console_keys": '{"alice": "' + ALICE + '"}',
                "console_view_keys": '{"alice": "' + BOB + '"}',
            },
            "must not give a name twice",
        ),
    ],
)
def test_a_bad_named_key_is_said_without_its_value(given: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        Settings.load(database_url=URL, **given)
    assert said in str(error.value)
    assert ALICE not in str(error.value)
    assert BOB not in str(error.value)
    assert ALICE[:-4] not in str(error.value)
    assert SECRET_NAME not in str(error.value)


def principal(claims: list[dict[str, str]], name_typ: str = "name") -> str:
    encoded = json.dumps({"auth_typ": "aad", "name_typ": name_typ, "claims": claims})
    return base64.b64encode(encoded.encode()).decode()


def test_on_azure_the_principal_names_the_caller_else_the_function_key() -> None:
    named = caller.of({"X-MS-CLIENT-PRINCIPAL-NAME": "ada@example.com"})
    assert (named.name, named.can_act) == ("ada@example.com", True)
    claims = [{"typ": "preferred_username", "val": "grace@example.com"}]
    assert caller.of({"x-ms-client-principal": principal(claims, "upn")}).name == (
        "grace@example.com"
    )
    for garbage in ("not base64!", base64.b64encode(b"[1]").decode(), principal([])):
        assert caller.of({"X-MS-CLIENT-PRINCIPAL": garbage}).name == "function key"
    assert caller.of({}).name == "function key"


def test_the_address_is_the_first_forwarded_one_without_its_port_and_the_agent_is_bounded() -> None:
    headers = {"X-Forwarded-For": "203.0.113.9:50112, 10.0.0.1", "User-Agent": "u" * 500}
    seen = caller.of(headers)
    assert (seen.address, len(seen.user_agent or "")) == ("203.0.113.9", 200)
    assert caller.of({"X-Forwarded-For": "[2001:db8::1]:443"}).address == "2001:db8::1"
    assert caller.of({}).address is None


def test_a_key_in_the_address_may_read_but_not_act() -> None:
    seen = caller.of({}, [("code", "k"), ("limit", "5")])
    assert seen.key_in_address
    with pytest.raises(BadRequestError, match="in the x-functions-key header, not in the address"):
        seen.acting()
    assert caller.of({}, [("limit", "5")]).acting().name == "function key"


def test_a_key_the_host_checked_names_the_caller_over_any_principal_header() -> None:
    token = caller.checked_key.set(caller.CheckedKey("vera", False, "192.0.2.4"))
    try:
        seen = caller.of({"X-MS-CLIENT-PRINCIPAL-NAME": "ops@contoso.com"})
    finally:
        caller.checked_key.reset(token)
    assert (seen.name, seen.can_act, seen.address) == ("vera", False, "192.0.2.4")


def test_the_record_of_actions_query_is_checked_and_its_cursor_goes_round() -> None:
    assert parse_action_query({}) == ActionQuery()
    assert parse_action_query({"limit": "5"}).limit == 5
    moment = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    cursor = action_cursor(moment, "id_with_underscores_")
    assert parse_action_query({"before": cursor}).before == (moment, "id_with_underscores_")
    for given, said in (
        ({"limit": "\u0665"}, "limit must be a whole number from 1 to 500"),
        ({"before": "!!"}, "before must be the cursor"),
        ({"actor": "x\x00"}, "actor contains a NUL character"),
        ({"until": "2026-01-01T00:00:00"}, "until needs a UTC offset"),
    ):
        with pytest.raises(BadRequestError, match=said):
            parse_action_query(given)


@pytest.mark.parametrize(
    "after",
    [
        "0001-01-01T00:00:00+14:00_7d4f2f5e-6b38-4a44-9a9e-6f7b1c9d2e11",  # year 0 in UTC
        "2026-01-01T00:00:00_7d4f2f5e-6b38-4a44-9a9e-6f7b1c9d2e11",  # no offset
        "2026-01-01T00:00:00Z_not-a-uuid",
    ],
)
def test_a_message_cursor_the_database_could_not_take_is_a_bad_request(after: str) -> None:
    with pytest.raises(BadRequestError, match=r"^after must be the cursor a previous page gave$"):
        parse_message_query({"after": after})


def test_an_endpoint_s_host_is_shown_without_its_path_query_or_capability() -> None:
    assert shown_host("https://user:pw@hooks.example.com:8443/in?token=abc") == "hooks.example.com"
    assert shown_host("https://eo5f1c2a9b8d7e6.m.pipedream.net/x") == "[redacted].m.pipedream.net"
