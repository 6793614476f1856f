"""The deployment as the template makes it, end to end: the app built as Flex's remote build
builds it (requirements.txt alone, Python 3.13), loaded under Microsoft's worker runtime with
exactly the app settings infra/azuredeploy.json sets, its queue, timer and HTTP functions run.

Stand-ins only for what cannot run here, each checking what the real one checks: the platform's
managed identity endpoint (azure-identity's real ManagedIdentityCredential calls it), Azure
Database for PostgreSQL's Entra sign-in (the role's password is the token; TLS required), Azure
Storage's OAuth (Azurite checks the token's audience, issuer and lifetime), and Application
Insights' ingestion (it requires the bearer token). The host's part (reading a hint from the
queue, calling the function) is the test's. Before this test, the deployed app could not reach
its database: requirements.txt held no azure-identity.
"""

from __future__ import annotations

import base64
import gzip
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiohttp import web
from azure.storage.queue import QueueClient
from standardwebhooks import Webhook

import outbox
from tests.conftest import SECRET
from tests.support import arm, password_pg
from tests.support.azure import DEV_ACCOUNT, DEV_KEY
from tests.support.azurite import Azurite
from tests.support.deployment import DeployedApp, FunctionsWorker, build_app, deployed_python
from tests.support.managed_identity import MONITOR, POSTGRES, STORAGE, IdentityEndpoint
from tests.support.outbox_helpers import run_cli
from tests.support.receiver import Receiver, Reply
from tests.support.tls import self_signed_certificate

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())
PARAMETERS = json.loads((ROOT / "infra" / "azuredeploy.parameters.json").read_text())
CLIENT_ID = "5a1d7c2e-0b9f-4c3e-9d8a-6f1e2b3c4d5e"  # what reference(identity).clientId gives
INSTRUMENTATION_KEY = "00000000-0000-0000-0000-00000000a1a1"


# --- The template's settings, resolved as ARM would with the test's values -----------------


def template_settings() -> dict[str, str]:
    given = {name: spec["value"] for name, spec in PARAMETERS["parameters"].items()}
    values = arm.Expressions(TEMPLATE, given)
    [site] = [r for r in TEMPLATE["resources"] if r["type"] == "Microsoft.Web/sites"]
    pairs = values.value(site["properties"]["siteConfig"]["appSettings"])
    return {pair["name"]: pair["value"] for pair in pairs}


def the_apps_settings(
    database_port: int, queue_service_uri: str, ingestion: str, webhooks: str
) -> dict[str, str]:
    """The template's app settings with what only Azure knows filled in: the identity's client
    id, Application Insights' connection string, the Key Vault reference's secret, and the
    addresses of the stand-ins in place of Azure's (nothing else changed)."""
    settings = template_settings()
    resolved = {name: value.replace("<client id>", CLIENT_ID) for name, value in settings.items()}
    vaulted = [name for name, value in resolved.items() if value.startswith("@Microsoft.KeyVault(")]
    assert vaulted == ["OUTBOX_WEBHOOKS"]  # the only secret with databaseAuth=entra
    resolved["OUTBOX_WEBHOOKS"] = webhooks
    connection = (
        f"InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint={ingestion};"
        f"LiveEndpoint={ingestion}"
    )
    assert resolved["APPLICATIONINSIGHTS_CONNECTION_STRING"] == "<connection string>"
    resolved["APPLICATIONINSIGHTS_CONNECTION_STRING"] = connection
    assert resolved["AzureWebJobsStorage__queueServiceUri"].startswith("https://")
    resolved["AzureWebJobsStorage__queueServiceUri"] = queue_service_uri
    url = urlsplit(resolved["OUTBOX_DATABASE_URL"])
    assert (url.port, url.query, url.password) == (5432, "sslmode=require", None)
    netloc = f"{url.username}@127.0.0.1:{database_port}"
    resolved["OUTBOX_DATABASE_URL"] = urlunsplit(url._replace(netloc=netloc))
    assert set(resolved) == set(settings)
    return resolved


# --- Stand-ins --------------------------------------------------------------------------------


class Ingestion:
    """Application Insights' ingestion endpoint, over TLS: records each item and the bearer
    token it came with, and refuses one without."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.items: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        self.refused = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> Ingestion:
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.context).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def names(self, base_type: str) -> set[str]:
        found = set()
        for item in self.items:
            data = item.get("data", {})
            if data.get("baseType") == base_type:
                found |= {m["name"] for m in data["baseData"].get("metrics", [])}
                found.add(data["baseData"].get("name", ""))
        return found

    async def _handle(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        if not authorization.startswith("Bearer "):
            self.refused += 1
            return web.json_response({"error": "no token"}, status=401)
        self.tokens.add(authorization.removeprefix("Bearer "))
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if "/track" in request.path:
            text = body.decode()
            lines = [text] if text.startswith("[") else text.splitlines()
            for line in lines:
                parsed = json.loads(line)
                self.items += parsed if isinstance(parsed, list) else [parsed]
        return web.json_response({"itemsReceived": 1, "itemsAccepted": 1, "errors": []})


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> DeployedApp:
    return build_app(tmp_path_factory.mktemp("flex"), deployed_python())


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def storage(certificate: tuple[Path, Path]) -> Iterator[Azurite]:
    azurite = Azurite(tls=certificate).start()
    yield azurite
    azurite.stop()


IDENTITY_NAME = urlsplit(template_settings()["OUTBOX_DATABASE_URL"]).username or ""
DATABASE = urlsplit(template_settings()["OUTBOX_DATABASE_URL"]).path.lstrip("/")


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[password_pg.PasswordServer]:
    server = password_pg.PasswordServer(tmp_path_factory.mktemp("pg") / "data", IDENTITY_NAME)
    yield server
    server.stop()


def admin_url(server: password_pg.PasswordServer) -> str:
    return server.admin.replace("/postgres?", f"/{DATABASE}?", 1)


async def prepare_database(server: password_pg.PasswordServer, token: str) -> None:
    """What docs/azure.md has the administrator run: migrate, then grant; the role's password
    then stands for Azure's Entra check of the token."""
    conn = await asyncpg.connect(server.admin)
    try:
        await conn.execute("SELECT pg_reload_conf()")
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()
    env = {"OUTBOX_DATABASE_URL": admin_url(server)}
    for args in (("migrate",), ("grant", IDENTITY_NAME)):
        done = await run_cli(*args, env=env)
        assert done.returncode == 0, done.stderr
    conn = await asyncpg.connect(server.admin)
    try:
        await conn.execute(f"ALTER ROLE \"{IDENTITY_NAME}\" PASSWORD '{token}'")
    finally:
        await conn.close()


@pytest.fixture
async def stand_ins(
    certificate: tuple[Path, Path],
) -> AsyncIterator[tuple[IdentityEndpoint, Ingestion]]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    identity = await IdentityEndpoint(CLIENT_ID).start()
    ingestion = await Ingestion(context).start()
    yield identity, ingestion
    await ingestion.stop()
    await identity.stop()


def hint_queue(storage: Azurite, certificate: tuple[Path, Path]) -> QueueClient:
    """The wake-up queue as the test (the host's side, a producer) reaches it: with the
    account's key, not the app's identity."""
    connection = (
        f"DefaultEndpointsProtocol=https;AccountName={DEV_ACCOUNT};AccountKey={DEV_KEY};"
        f"QueueEndpoint={storage.queue_service_uri};"
    )
    return QueueClient.from_connection_string(
        connection, template_settings()["OUTBOX_QUEUE_NAME"], connection_verify=str(certificate[0])
    )


async def test_the_deployed_app_relays_with_the_templates_settings(
    deployed: DeployedApp,
    certificate: tuple[Path, Path],
    storage: Azurite,
    database: password_pg.PasswordServer,
    stand_ins: tuple[IdentityEndpoint, Ingestion],
    receiver: Receiver,
) -> None:
    identity, ingestion = stand_ins
    await prepare_database(database, identity.tokens[POSTGRES])
    front = await password_pg.TlsFront(database, *certificate).start()
    queue = hint_queue(storage, certificate)
    queue.create_queue()
    webhooks = json.dumps({"OrderCompleted": {"url": receiver.url("/orders"), "secret": SECRET}})
    settings = the_apps_settings(front.port, storage.queue_service_uri, ingestion.url, webhooks)
    platform = {
        **identity.environment,
        "WEBSITE_SKU": "FlexConsumption",
        "WEBSITE_SITE_NAME": "outbox-uuuuuuuuuuuuu",
        # The machine's trust store: the stand-ins' certificate.
        "SSL_CERT_FILE": str(certificate[0]),
        "REQUESTS_CA_BUNDLE": str(certificate[0]),
        # Microsoft's own telemetry about the SDK goes to Microsoft: not from a test.
        "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true",
    }
    owner = await asyncpg.connect(admin_url(database))
    try:
        async with FunctionsWorker(deployed, {**settings, **platform}) as worker:
            await run_through_the_triggers(worker, owner, queue, receiver)
        assert worker.returncode == 0, worker.stderr
    finally:
        await owner.close()
        await front.stop()

    # Every Azure sign-in went through the identity endpoint, as the template's identity.
    assert identity.resources_asked() == {STORAGE, POSTGRES, MONITOR}
    assert {a.client_id for a in identity.asked} == {CLIENT_ID}
    assert front.plain_refused == 0  # the database was reached over TLS only
    # Application Insights got the relay's telemetry with the identity's token, including the
    # gauge the template's alerts read (by the name their queries use).
    assert ingestion.tokens == {identity.tokens[MONITOR]}
    assert ingestion.refused == 0
    assert "outbox.backlog.oldest_unpublished_age" in ingestion.names("MetricData")
    assert "'outbox.backlog.oldest_unpublished_age'" in TEMPLATE["variables"]["sweepQuery"]
    # The host sends the logs: the relay's exporter does not send them again.
    assert ingestion.names("MessageData") == set()


async def run_through_the_triggers(
    worker: FunctionsWorker, owner: Any, queue: QueueClient, receiver: Receiver
) -> None:
    # A producer's message and its hint; the host reads the hint and calls the queue function.
    async with owner.transaction():
        first = await outbox.enqueue(owner, "OrderCompleted", {"orderId": 1})
    await outbox_hint(queue)
    result = await worker.invoke_queue("outbox_queue", take_hint(queue))
    assert result.status == "Success", result.stack_trace
    assert [r.webhook_id for r in receiver.requests] == [str(first)]
    delivered = receiver.requests[0]
    Webhook(SECRET).verify(delivered.body, delivered.headers)
    assert await state(owner, first) == "Processed"

    # The timer's sweep finds a message whose hint was lost (and records the backlog gauge).
    async with owner.transaction():
        second = await outbox.enqueue(owner, "OrderCompleted", {"orderId": 2})
    result = await worker.invoke_timer("outbox_timer")
    assert result.status == "Success", result.stack_trace
    assert await state(owner, second) == "Processed"

    # HTTP: status, a drain that fails a message for good, a requeue that wakes a run through
    # the identity-based queue (the relay's own hint, sent with the identity's token).
    status = await worker.invoke_http("outbox_status", "GET", "/api/outbox/status")
    assert status.http is not None
    assert (status.http.status, status.http.json()["healthy"]) == (200, True)
    receiver.script("/orders", Reply(410))
    async with owner.transaction():
        third = await outbox.enqueue(owner, "OrderCompleted", {"orderId": 3})
    drained = await worker.invoke_http("outbox_drain", "POST", "/api/outbox/drain")
    assert drained.http is not None
    assert drained.http.json()["failed"] == 1
    assert await state(owner, third) == "Failed"
    requeued = await worker.invoke_http(
        "outbox_requeue", "POST", "/api/outbox/requeue", body=json.dumps({"all_failed": True})
    )
    assert requeued.http is not None
    assert requeued.http.status == 200, requeued.http.body
    assert await state(owner, third) == "Pending"
    result = await worker.invoke_queue("outbox_queue", take_hint(queue))
    assert result.status == "Success", result.stack_trace
    assert await state(owner, third) == "Processed"


async def outbox_hint(queue: QueueClient) -> None:
    """What ``outbox.notify`` sends after the producer's commit (base64, as host.json expects)."""
    queue.send_message(base64.b64encode(b'{"requestedAt": "now"}').decode())


def take_hint(queue: QueueClient) -> str:
    """The host's part: one hint off the queue, decoded as host.json's messageEncoding says."""
    [message] = list(queue.receive_messages(max_messages=1))
    queue.delete_message(message)
    return base64.b64decode(message.content).decode()


async def state(conn: Any, message_id: Any) -> str:
    status: str = await conn.fetchval(
        "SELECT status FROM outbox_messages WHERE outbox_message_id = $1", message_id
    )
    return status
