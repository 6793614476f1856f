"""``outbox serve``'s own checks: function keys on raw requests, host.json, its port, its logs."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from pathlib import Path

import azure.functions as func
import pytest
from aiohttp import test_utils, web

from outbox.azure import caller
from outbox.core.errors import ConfigurationError
from outbox.core.redact import Redactor
from outbox.hosting.serve import (
    Binding,
    QueueOptions,
    ServeKey,
    ServeOptions,
    WrongKeys,
    failure_redactor,
    http_app,
    run_timer,
    start_http,
)

KEY = "serve-unit-function-key-0123456789"


async def ok(request: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("{}", status_code=200, mimetype="application/json")


async def raw_status(server: test_utils.TestServer, header: bytes) -> int:
    """The status of ``POST /api/outbox/drain`` sent with ``header``, bytes exactly as given."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /api/outbox/drain HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        + header
        + b"\r\nConnection: close\r\n\r\n"
    )
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (b"x-functions-key: \xff\xfe", 401),
        (b"x-functions-key: caf\xc3\xa9-not-the-key", 401),
        (b"x-functions-key: " + KEY.encode(), 200),
    ],
)
async def test_a_function_key_header_of_any_bytes_is_checked_not_crashed_on(
    header: bytes, status: int
) -> None:
    binding = Binding("drain", {"route": "outbox/drain", "methods": ["POST"]}, ok)
    async with test_utils.TestServer(http_app([binding], KEY)) as server:
        assert await raw_status(server, header) == status


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "host.json: not valid JSON"),
        ('{"extensions": {"queues": {"maxPollingInterval": 2}}}', "not a hh:mm:ss time span: 2"),
        ('{"extensions": {"queues": {"maxDequeueCount": "five"}}}', "maxDequeueCount"),
        ("[1]", "host.json: not a JSON object"),
    ],
)
def test_a_bad_host_json_is_a_configuration_error(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=re.escape(problem)):
        QueueOptions.from_host_json(path)


def test_a_missing_host_json_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("host.json: cannot read")):
        QueueOptions.from_host_json(tmp_path / "host.json")


async def test_a_port_in_use_is_reported_as_such() -> None:
    binding = Binding("drain", {"type": "httpTrigger", "route": "outbox/drain"}, ok)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        expected = re.escape(f"cannot listen on 127.0.0.1:{port}")
        with pytest.raises(ConfigurationError, match=expected):
            await start_http([binding], ServeOptions(port=port))


TOKEN = "sv=2024&sig=c2VydmUtdW5pdC1zZWNyZXQtdG9rZW4"


async def boom(*_: object) -> None:
    raise RuntimeError(f"a bug that quotes https://hooks.example/in?{TOKEN}")


async def test_a_failing_http_function_answers_500_and_logs_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    binding = Binding("drain", {"route": "outbox/drain", "methods": ["POST"]}, boom)
    redact = Redactor([f"https://hooks.example/in?{TOKEN}"])
    async with test_utils.TestServer(http_app([binding], KEY, redact)) as server:
        assert await raw_status(server, b"x-functions-key: " + KEY.encode()) == 500
    assert "drain failed: Traceback" in caplog.text
    assert "RuntimeError: a bug that quotes [redacted]" in caplog.text
    assert "c2VydmUtdW5pdC1zZWNyZXQtdG9rZW4" not in caplog.text


async def test_a_failing_timer_function_is_logged_without_its_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopping = asyncio.Event()
    fired = asyncio.Event()

    async def failing(_: object) -> None:
        fired.set()
        await boom()

    binding = Binding("sweep", {"schedule": "* * * * * *"}, failing)
    redact = Redactor([f"https://hooks.example/in?{TOKEN}"])
    timer = asyncio.create_task(run_timer(binding, stopping, redact))
    await asyncio.wait_for(fired.wait(), 30)
    stopping.set()
    await asyncio.wait_for(timer, 30)
    assert "sweep failed: RuntimeError: a bug that quotes [redacted]" in caplog.text
    assert "c2VydmUtdW5pdC1zZWNyZXQtdG9rZW4" not in caplog.text


def test_serve_hides_the_app_s_secrets_and_credential_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "https://hooks.example/in/Zq8u2RkWq0PbX7Lm"
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql://app:pa55word@db.example:5432/app")
    monkeypatch.setenv("OUTBOX_WEBHOOKS", json.dumps({"OrderCompleted": {"url": url}}))
    redact = failure_redactor()
    assert redact(f"failed: {url} as app:pa55word") == "failed: [redacted] as app:[redacted]"
    monkeypatch.setenv("OUTBOX_WEBHOOKS", "{not json")
    assert failure_redactor()("AccountKey=abc123==;") == "AccountKey=[redacted];"


def test_serve_hosts_the_relay_s_blueprint_or_an_app_named_module_attribute() -> None:
    from outbox.hosting.serve import index, load_app

    names = {"outbox_queue", "outbox_timer", "outbox_drain", "outbox_status"}
    names |= {"outbox_requeue", "outbox_purge", "outbox_console", "outbox_overview"}
    names |= {"outbox_messages", "outbox_message", "outbox_actions", "outbox_pause"}
    names |= {"outbox_resume", "outbox_resend", "outbox_endpoints", "outbox_cancel"}
    names |= {"outbox_replay", "outbox_probe"}
    assert {b.name for b in index(load_app())} == names  # by default: outbox.functions.bp
    import function_app

    assert load_app("function_app:app") is function_app.app  # indexed once per process, elsewhere
    assert {b.name for b in index(load_app("outbox.functions:bp"))} == names  # a Blueprint
    for spec, problem in [
        ("function_app", "--app must be module:attribute"),
        ("no_such_module:app", "No module named 'no_such_module'"),
        ("outbox.functions:nothing", "has no attribute 'nothing'"),
        ("outbox.functions:json_response", "is neither a FunctionApp nor a Blueprint"),
    ]:
        with pytest.raises(ConfigurationError, match=problem):
            load_app(spec)


async def test_a_route_or_method_nobody_serves_is_answered_in_json() -> None:
    binding = Binding(
        "outbox_status", {"type": "httpTrigger", "route": "outbox/status", "methods": ["GET"]}, ok
    )
    app = http_app([binding], KEY)
    async with test_utils.TestServer(app) as server, test_utils.TestClient(server) as client:
        missing = await client.get("/api/nowhere")
        assert (missing.status, missing.content_type) == (404, "application/json")
        assert await missing.json() == {"error": "no such route: GET /api/nowhere"}
        wrong = await client.delete("/api/outbox/status")
        assert (wrong.status, wrong.headers["Allow"]) == (405, "GET")
        assert await wrong.json() == {
            "error": "DELETE is not allowed on /api/outbox/status; use GET"
        }


async def test_the_view_key_opens_the_functions_that_only_read_and_no_other() -> None:
    view = "serve-unit-view-key-0123456789"
    reads = Binding("overview", {"route": "outbox/overview", "methods": ["GET"]}, ok)
    acts = Binding("pause", {"route": "outbox/pause", "methods": ["POST"]}, ok)
    app = http_app([reads, acts], KEY, view_key=view)
    async with test_utils.TestServer(app) as server, test_utils.TestClient(server) as client:
        answers = []
        for method, route in [("GET", "overview"), ("POST", "pause")]:
            for key in (view, KEY, "wrong-key-0123456789"):
                response = await client.request(
                    method, f"/api/outbox/{route}", headers={"x-functions-key": key}
                )
                answers.append(response.status)
    assert answers == [200, 200, 401, 401, 200, 401]


ALICE = "alice-acts-key-0123456789"
VIEWER = "vera-reads-key-0123456789"


async def who_calls(request: func.HttpRequest) -> func.HttpResponse:
    """A function that answers with the caller its host says it has."""
    who = caller.of(request.headers, [])
    body = {"name": who.name, "can_act": who.can_act, "address": who.address}
    return func.HttpResponse(json.dumps(body), status_code=200, mimetype="application/json")


def named_app(wrong_keys: WrongKeys | None = None) -> web.Application:
    reads = Binding("overview", {"route": "outbox/overview", "methods": ["GET"]}, who_calls)
    acts = Binding("pause", {"route": "outbox/pause", "methods": ["POST"]}, who_calls)
    named = (ServeKey("alice", ALICE, True), ServeKey("vera", VIEWER, False))
    return http_app([reads, acts], KEY, named=named, wrong_keys=wrong_keys)


async def test_a_named_key_s_name_is_the_caller_and_a_viewer_s_may_not_act() -> None:
    async with (
        test_utils.TestServer(named_app()) as server,
        test_utils.TestClient(server) as client,
    ):
        spoofed = {"X-MS-CLIENT-PRINCIPAL-NAME": "ops@contoso.com"}  # no App Service Auth here
        seen = []
        for method, route, key in [
            ("GET", "overview", ALICE),
            ("POST", "pause", ALICE),
            ("GET", "overview", VIEWER),
            ("GET", "overview", KEY),
        ]:
            response = await client.request(
                method, f"/api/outbox/{route}", headers={"x-functions-key": key} | spoofed
            )
            assert response.status == 200
            seen.append(await response.json())
        refused = await client.post("/api/outbox/pause", headers={"x-functions-key": VIEWER})
        assert refused.status == 401
        assert (await refused.json())["error"] == "this key may read, not act: use a key that acts"
        assert refused.headers["X-Content-Type-Options"] == "nosniff"
        assert refused.headers["Cache-Control"] == "no-store"
    assert [(s["name"], s["can_act"]) for s in seen] == [
        ("alice", True),
        ("alice", True),
        ("vera", False),
        ("function key", True),
    ]
    assert seen[0]["address"] == "127.0.0.1"
    assert caller.checked_key.get() is None  # set for the call alone


async def test_wrong_keys_are_logged_without_key_material_then_the_address_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    wrong_keys = WrongKeys(clock=lambda: now[0])
    app = named_app(wrong_keys)
    guess = "guess-" + ALICE[6:]
    async with test_utils.TestServer(app) as server, test_utils.TestClient(server) as client:
        agent = {"User-Agent": 'scanner/1 user_agent="forged"'}
        for _ in range(10):
            response = await client.get(
                "/api/outbox/overview", headers={"x-functions-key": guess} | agent
            )
            assert response.status == 401
        throttled = await client.get("/api/outbox/overview", headers={"x-functions-key": ALICE})
        assert throttled.status == 429  # the right key too: guessing has to wait
        assert throttled.headers["Retry-After"] == "60"
        assert "too many wrong keys" in (await throttled.json())["error"]
        elsewhere = await client.get(
            "/api/outbox/overview",
            headers={"x-functions-key": ALICE, "X-Forwarded-For": "203.0.113.7"},
        )
        assert elsewhere.status == 200  # another client behind the same proxy
        now[0] += 45
        later = await client.get("/api/outbox/overview", headers={"x-functions-key": ALICE})
        assert (later.status, later.headers["Retry-After"]) == (429, "15")
        now[0] += 15
        again = await client.get("/api/outbox/overview", headers={"x-functions-key": ALICE})
        assert again.status == 200
        missing = await client.get("/api/outbox/overview")
        assert missing.status == 401  # no key at all: refused, neither logged nor counted
    lines = [r.getMessage() for r in caplog.records if "outbox.wrong_key" in r.getMessage()]
    assert len(lines) == 10
    assert "address=127.0.0.1" in lines[0]
    assert 'route="GET /api/outbox/overview"' in lines[0]
    assert 'user_agent="scanner/1 user_agent=\\"forged\\""' in lines[0]
    assert "throttled=True" in lines[-1]
    assert not any(guess in r.getMessage() or ALICE in r.getMessage() for r in caplog.records)


def test_the_wrong_keys_of_many_addresses_are_bounded() -> None:
    wrong_keys = WrongKeys(allowed=2, remembered=3, clock=lambda: 5.0)
    for address in ("a", "b", "c", "d"):
        wrong_keys.failed(address)
        wrong_keys.failed(address)
    assert [wrong_keys.retry_after(a) > 0 for a in ("a", "b", "c", "d")] == [
        False,
        True,
        True,
        True,
    ]
