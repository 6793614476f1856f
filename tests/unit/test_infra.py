"""infra/azuredeploy.json: valid by Microsoft's ARM schemas, and true to the relay it deploys."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from outbox.core.settings import DEFAULT_QUEUE_NAME, Settings, env_name
from outbox.core.telemetry import Backlog
from tests.support import arm
from tests.support.telemetry import Sdk

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())
PARAMETERS = json.loads((ROOT / "infra" / "azuredeploy.parameters.json").read_text())
IDENTITY = (
    "[resourceId('Microsoft.ManagedIdentity/userAssignedIdentities', variables('identityName'))]"
)

# Azure's built-in roles (their ids are the same in every tenant) and the resource each is given on.
ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f276bb0955b": (
        "Storage Blob Data Owner",
        "Microsoft.Storage/storageAccounts",
    ),
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": (
        "Storage Queue Data Contributor",
        "Microsoft.Storage/storageAccounts",
    ),
    "3913510d-42f4-4e42-8a64-420c390055eb": (
        "Monitoring Metrics Publisher",
        "Microsoft.Insights/components",
    ),
    "4633458b-17de-408a-b874-0445c86b69e6": ("Key Vault Secrets User", "Microsoft.KeyVault/vaults"),
}
QUEUE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"  # Storage Queue Data Message Sender
# The settings the template sets for the Functions host and the Azure SDKs, not for Settings.
PLATFORM = {
    "AzureWebJobsStorage__blobServiceUri",  # the host's keys and timer leases
    "AZURE_CLIENT_ID",  # DefaultAzureCredential (notify()) picks the user-assigned identity
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",  # Entra sign-in: local auth is off
}


def resources(kind: str, template: dict[str, Any] = TEMPLATE) -> list[dict[str, Any]]:
    return [r for r in template["resources"] if r["type"] == kind]


def expressions(**parameters: Any) -> arm.Expressions:
    given = {name: spec["value"] for name, spec in PARAMETERS["parameters"].items()}
    return arm.Expressions(TEMPLATE, {**given, **parameters})


def app_settings(**parameters: Any) -> dict[str, str]:
    [site] = resources("Microsoft.Web/sites")
    pairs = expressions(**parameters).value(site["properties"]["siteConfig"]["appSettings"])
    return {pair["name"]: pair["value"] for pair in pairs}


def relay_names() -> set[str]:
    return {env_name(field) for field in Settings.model_fields}


# --- Microsoft's schemas ---------------------------------------------------------------------


def test_the_template_is_valid_by_microsofts_schemas() -> None:
    assert arm.errors(TEMPLATE, arm.TEMPLATE_SCHEMA) == []
    assert [e for r in TEMPLATE["resources"] for e in arm.resource_errors(r)] == []


def test_the_parameters_file_is_valid_and_names_only_the_templates_parameters() -> None:
    assert arm.errors(PARAMETERS, arm.PARAMETERS_SCHEMA) == []
    assert set(PARAMETERS["parameters"]) <= set(TEMPLATE["parameters"])


@pytest.mark.parametrize(
    ("kind", "key", "wrong"),
    [
        ("Microsoft.Storage/storageAccounts", "apiVersion", "2099-01-01"),
        ("Microsoft.Storage/storageAccounts", "properties", {"allowSharedKeyAccess": "no"}),
        (
            "Microsoft.Web/sites",
            "properties",
            {"functionAppConfig": {"runtime": {"name": "cobol"}}},
        ),
        (
            "Microsoft.DBforPostgreSQL/flexibleServers",
            "properties",
            {"authConfig": {"passwordAuth": "Off"}},
        ),
    ],
)
def test_the_schema_check_would_catch_a_mistake(kind: str, key: str, wrong: Any) -> None:
    broken = copy.deepcopy(TEMPLATE)
    [resource] = resources(kind, broken)[:1]
    resource[key] = wrong
    assert arm.errors(broken, arm.TEMPLATE_SCHEMA)
    assert arm.resource_errors(resource)


# --- What the relay needs ---------------------------------------------------------------------


def test_the_app_settings_are_what_settings_reads_or_the_host_needs() -> None:
    names = set(app_settings())
    required = {env_name(f) for f, info in Settings.model_fields.items() if info.is_required()}
    assert required <= names
    assert "OUTBOX_QUEUE_NAME" in names  # the queue trigger's %OUTBOX_QUEUE_NAME%
    assert names - PLATFORM <= relay_names()
    assert {"OUTBOX_DATABASE_AUTH", "OUTBOX_DATABASE_CLIENT_ID"} <= relay_names()
    assert {"AzureWebJobsStorage", "OUTBOX_FUNCTION_KEY"}.isdisjoint(names)  # keys, not identity


@pytest.mark.parametrize("auth", ["entra", "password"])
def test_the_app_settings_load_as_the_relays_settings(
    auth: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in relay_names():
        monkeypatch.delenv(name, raising=False)
    # The platform puts each Key Vault reference's secret in its place.
    secrets = {"OUTBOX_DATABASE_URL": "postgresql://app:pw@db/outbox", "OUTBOX_WEBHOOKS": "{}"}
    for name, value in app_settings(databaseAuth=auth).items():
        vaulted = value.startswith("@Microsoft.KeyVault(")
        monkeypatch.setenv(name, secrets[name] if vaulted else value)
    settings = Settings.load()
    assert settings.database_auth == auth
    assert settings.queue_credential == "managedidentity"
    assert settings.queue_client_id == settings.database_client_id
    assert settings.database_client_id  # the identity's, which the template resolves
    assert settings.queue_name == DEFAULT_QUEUE_NAME
    assert settings.queue_service_uri == "https://outboxuuuuuuuuuuuuu.queue.core.windows.net"
    assert settings.db_pool_size == 4
    assert settings.alert_oldest_pending_seconds == 900


def test_the_settings_it_sets_are_documented() -> None:
    table = (ROOT / "docs" / "configuration.md").read_text()
    azure = (ROOT / "docs" / "azure.md").read_text()
    for name in set(app_settings()) & relay_names():
        assert f"| `{name}` |" in table, name
    for name in PLATFORM:
        assert f"`{name}`" in azure, name


def test_the_wake_up_queue_is_the_relays_default_and_has_its_poison_queue() -> None:
    assert TEMPLATE["parameters"]["queueName"]["defaultValue"] == DEFAULT_QUEUE_NAME
    names = [
        expressions().value(q["name"])
        for q in resources("Microsoft.Storage/storageAccounts/queueServices/queues")
    ]
    assert sorted(n.rsplit("/", 1)[1] for n in names) == [
        DEFAULT_QUEUE_NAME,
        f"{DEFAULT_QUEUE_NAME}-poison",
    ]
    assert app_settings(queueName="orders-wakeup")["OUTBOX_QUEUE_NAME"] == "orders-wakeup"


@pytest.mark.parametrize("pool", [2, 3, 4, 7, 10, 100])
@pytest.mark.parametrize("connections", [2, 5, 40, 97, 400, 5000])
def test_instances_times_pool_size_stay_within_the_connections_allowed(
    pool: int, connections: int
) -> None:
    values = expressions(dbPoolSize=pool, maxDatabaseConnections=connections)
    [site] = resources("Microsoft.Web/sites")
    config = values.value(site["properties"]["functionAppConfig"])
    instances = config["scaleAndConcurrency"]["maximumInstanceCount"]
    assert instances * pool <= connections
    assert instances == min(1000, connections // pool)  # no lower than it need be
    assert app_settings(dbPoolSize=pool)["OUTBOX_DB_POOL_SIZE"] == str(pool)


# --- Identity, not keys -----------------------------------------------------------------------


def test_storage_is_reached_by_the_user_assigned_identity_with_shared_keys_off() -> None:
    [account] = resources("Microsoft.Storage/storageAccounts")
    assert account["properties"]["allowSharedKeyAccess"] is False
    assert account["properties"]["allowBlobPublicAccess"] is False
    [site] = resources("Microsoft.Web/sites")
    assert site["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    assert site["properties"]["keyVaultReferenceIdentity"] == IDENTITY
    storage = site["properties"]["functionAppConfig"]["deployment"]["storage"]
    assert storage["authentication"] == {
        "type": "UserAssignedIdentity",
        "userAssignedIdentityResourceId": IDENTITY,
    }
    settings = app_settings()
    assert settings["AzureWebJobsStorage__credential"] == "managedidentity"
    assert settings["AzureWebJobsStorage__clientId"] == settings["AZURE_CLIENT_ID"] == "<client id>"
    assert (
        settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
        == "ClientId=<client id>;Authorization=AAD"
    )


def test_the_plan_is_flex_consumption_running_python() -> None:
    [plan] = resources("Microsoft.Web/serverfarms")
    assert plan["sku"] == {"name": "FC1", "tier": "FlexConsumption"}
    [site] = resources("Microsoft.Web/sites")
    assert site["properties"]["functionAppConfig"]["runtime"]["name"] == "python"
    assert "FUNCTIONS_WORKER_RUNTIME" not in app_settings()  # Flex takes the runtime from the plan


def test_the_role_assignments_are_exactly_the_least_privileged_ones() -> None:
    given = {}
    for assignment in resources("Microsoft.Authorization/roleAssignments"):
        properties = assignment["properties"]
        [role] = re.findall(r"roles'\)\.(\w+)", properties["roleDefinitionId"])
        role_id = TEMPLATE["variables"]["roles"][role]
        [scope_kind] = re.findall(r"resourceId\('([^']+)'", assignment["scope"])
        given[role_id] = (ROLES.get(role_id, ("?",))[0], scope_kind)
        assert properties["principalType"] == "ServicePrincipal"
        assert properties["principalId"].startswith(f"[reference({IDENTITY[1:-1]}")
    assert given == ROLES


def test_the_outputs_name_the_role_a_producer_needs() -> None:
    role = expressions().value(TEMPLATE["outputs"]["producerQueueRole"]["value"])
    assert role["roleName"] == "Storage Queue Data Message Sender"
    assert TEMPLATE["variables"]["roles"]["storageQueueDataMessageSender"] == QUEUE_SENDER
    assert role["roleDefinitionId"].endswith(QUEUE_SENDER + ">")
    assert role["scope"].endswith(f"default/{DEFAULT_QUEUE_NAME}>")  # the queue, not the account


# --- No secrets -------------------------------------------------------------------------------

SECRET_SHAPES = re.compile(
    r"whsec_|AccountKey=|SharedAccessSignature|InstrumentationKey=|sig=|password\s*[=:]"
    r"|://[^/@\s:]+:[^/@\s]+@|listKeys|listSecrets|administratorLoginPassword",
    re.IGNORECASE,
)


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*strings(k), *strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


def test_no_literal_or_default_holds_a_secret() -> None:
    found = [s for s in strings(TEMPLATE) + strings(PARAMETERS) if SECRET_SHAPES.search(s)]
    assert found == []
    for name, spec in TEMPLATE["parameters"].items():
        if spec["type"].lower() == "securestring":
            assert spec.get("defaultValue", "") == "", name


def test_the_secret_parameters_go_only_into_key_vault() -> None:
    secure = [n for n, s in TEMPLATE["parameters"].items() if s["type"].lower() == "securestring"]
    assert sorted(secure) == ["databaseUrl", "webhooks"]
    for name in secure:
        used = f"parameters('{name}')"
        [secret] = [
            r for r in resources("Microsoft.KeyVault/vaults/secrets") if used in json.dumps(r)
        ]
        uses = {s for s in strings(TEMPLATE) if used in s}
        assert uses == {secret["properties"]["value"], secret["condition"]}, name


@pytest.mark.parametrize("auth", ["entra", "password"])
def test_the_secret_settings_are_key_vault_references_or_hold_no_password(auth: str) -> None:
    settings = app_settings(databaseAuth=auth)
    vault = "https://outbox-uuuuuuuuuuuuu.vault.azure.net/secrets/"
    assert settings["OUTBOX_WEBHOOKS"] == f"@Microsoft.KeyVault(SecretUri={vault}outbox-webhooks/)"
    url = settings["OUTBOX_DATABASE_URL"]
    if auth == "password":
        assert url == f"@Microsoft.KeyVault(SecretUri={vault}outbox-database-url/)"
    else:
        parts = urlsplit(url)
        assert parts.password is None
        assert parts.username == "outbox-id-uuuuuuuuuuuuu"  # the identity, as PostgreSQL knows it
        assert parts.query == "sslmode=require"


def test_postgres_when_made_takes_microsoft_entra_sign_in_only() -> None:
    [server] = resources("Microsoft.DBforPostgreSQL/flexibleServers")
    assert server["condition"] == "[parameters('createPostgresServer')]"
    assert TEMPLATE["parameters"]["createPostgresServer"]["defaultValue"] is False
    assert server["properties"]["authConfig"]["passwordAuth"] == "Disabled"
    assert server["properties"]["authConfig"]["activeDirectoryAuth"] == "Enabled"
    assert "administratorLogin" not in server["properties"]


# --- Monitoring -------------------------------------------------------------------------------


def test_logs_and_insights_take_microsoft_entra_sign_in_only() -> None:
    [workspace] = resources("Microsoft.OperationalInsights/workspaces")
    assert workspace["properties"]["features"]["disableLocalAuth"] is True
    [insights] = resources("Microsoft.Insights/components")
    assert insights["properties"]["DisableLocalAuth"] is True


def test_the_backlog_alert_reads_the_gauge_the_relay_emits() -> None:
    sdk = Sdk.start()
    telemetry = sdk.telemetry()
    telemetry.record_backlog(Backlog(counts={"Pending": 3}, oldest_unpublished_age_seconds=1200.0))
    [point] = sdk.points("outbox.backlog.oldest_unpublished_age")
    assert point.value == 1200.0
    [rule] = resources("Microsoft.Insights/scheduledQueryRules")
    [condition] = rule["properties"]["criteria"]["allOf"]
    query = expressions().value(condition["query"])
    assert "where name == 'outbox.backlog.oldest_unpublished_age'" in query
    assert condition["metricMeasureColumn"] in query
    assert (condition["operator"], condition["timeAggregation"]) == ("GreaterThan", "Maximum")
    # One threshold for the alert and for `status`'s healthy/unhealthy.
    assert expressions(alertOldestPendingSeconds=600).value(condition["threshold"]) == 600
    assert (
        app_settings(alertOldestPendingSeconds=600)["OUTBOX_ALERT_OLDEST_PENDING_SECONDS"] == "600"
    )
