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
from tests.support import arm, indexing
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


# Flex Consumption scales each scale group on its own: the HTTP functions together, every other
# function alone (tests/platform/flex-consumption.json, "scaleGroups"); a timer function runs on one
# instance at a time (its schedule's lease), and a pool opens no connection before its first use.
def scale_groups() -> dict[str, str]:
    """Each scale group of the app, and how it scales: "on demand" or "timer"."""
    groups = {}
    for name, bindings in indexing.EXPECTED.items():
        kind = bindings[0]["type"]
        if kind == "httpTrigger":
            groups["http"] = "on demand"
        else:
            groups[f"function:{name}"] = "timer" if kind == "timerTrigger" else "on demand"
    return groups


def site_config(**parameters: Any) -> dict[str, Any]:
    [site] = resources("Microsoft.Web/sites")
    config: dict[str, Any] = expressions(**parameters).value(
        site["properties"]["functionAppConfig"]
    )
    return config


def test_the_template_counts_every_scale_group_the_app_has() -> None:
    assert scale_groups() == {
        "http": "on demand",
        "function:outbox_queue": "on demand",
        "function:outbox_timer": "timer",
        "function:outbox_purge": "timer",
    }
    variables = TEMPLATE["variables"]
    assert variables["onDemandScaleGroups"] == list(scale_groups().values()).count("on demand")
    assert variables["timerScaleGroups"] == list(scale_groups().values()).count("timer")


def worst_case(instances: int, pool: int) -> int:
    """Every on-demand group at its maximum instance count, each timer on one, every pool full."""
    kinds = list(scale_groups().values())
    return (kinds.count("on demand") * instances + kinds.count("timer")) * pool


@pytest.mark.parametrize("pool", [2, 3, 4, 7, 100])
@pytest.mark.parametrize("connections", [8, 40, 97, 400, 640, 5000])
@pytest.mark.parametrize("sku", sorted(TEMPLATE["variables"]["postgresSkus"]))
def test_the_worst_case_of_connections_stays_within_the_server(
    pool: int, connections: int, sku: str
) -> None:
    """Every scale group at its worst, every instance's pool full: never more than the relay's
    share, nor than the server's user connections less the others'."""
    user = TEMPLATE["variables"]["postgresSkus"][sku]["userConnections"]
    for create in (True, False):
        given = {
            "dbPoolSize": pool,
            "maxDatabaseConnections": connections,
            "postgresSkuName": sku,
            "createPostgresServer": create,
            "databaseHost": "db.example.org",
            "lowestMaximumInstanceCount": 1,
        }
        values = expressions(**given)
        share = min(connections, user - 100) if create else connections
        if share < 8:  # fewer than two connections per scale group: refused at the start
            with pytest.raises(arm.TemplateError, match="fewer than 2 for each of its 4"):
                site_config(**given)
            continue
        instances = site_config(**given)["scaleAndConcurrency"]["maximumInstanceCount"]
        pool_size = int(app_settings(**given)["OUTBOX_DB_POOL_SIZE"])
        assert 1 <= instances <= 1000
        assert 2 <= pool_size <= pool
        assert worst_case(instances, pool_size) <= connections
        if create:
            assert worst_case(instances, pool_size) <= (
                user - values.parameters["otherDatabaseConnections"]
            )


def test_the_defaults_give_every_scale_group_more_than_the_lowest_maximum_flex_takes() -> None:
    config = site_config()["scaleAndConcurrency"]
    assert config["maximumInstanceCount"] == 79  # (640 / 4 - 2 timers) / 2 groups
    assert worst_case(79, 4) == 640
    assert app_settings()["OUTBOX_DB_POOL_SIZE"] == "4"
    sku = TEMPLATE["variables"]["postgresSkus"][expressions().parameters["postgresSkuName"]]
    assert sku["userConnections"] >= 640 + 100
    # One instance takes several HTTP calls at once (Flex's default for Python is one).
    assert config["triggers"]["http"]["perInstanceConcurrency"] == 16


def test_a_budget_below_the_lowest_maximum_fails_at_the_start_saying_why() -> None:
    with pytest.raises(arm.TemplateError, match="maxDatabaseConnections allows 4 instances"):
        site_config(maxDatabaseConnections=40)
    # Where Microsoft allows lower maxima, the user says so and it deploys.
    low = site_config(maxDatabaseConnections=40, lowestMaximumInstanceCount=1)
    assert low["scaleAndConcurrency"]["maximumInstanceCount"] == 4  # (40 / 4 - 2) / 2


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


def role_deployment() -> dict[str, Any]:
    [deployment] = resources("Microsoft.Resources/deployments")
    return deployment


def test_the_role_assignments_are_exactly_the_least_privileged_ones() -> None:
    deployment = role_deployment()
    inner = deployment["properties"]["template"]
    # The identity's principal id reaches the nested template as a parameter, so that each
    # assignment's name can derive from it (a name cannot read reference() in the outer one).
    given = deployment["properties"]["parameters"]["given"]["value"]
    assert given["principalId"].startswith(f"[reference({IDENTITY[1:-1]}")
    assert given["principalId"].endswith(".principalId]")
    assigned = {}
    for assignment in inner["resources"]:
        assert assignment["type"] == "Microsoft.Authorization/roleAssignments"
        properties = assignment["properties"]
        [role] = re.findall(r"roles\.(\w+)", properties["roleDefinitionId"])
        role_id = TEMPLATE["variables"]["roles"][role]
        [scope_kind] = re.findall(r"resourceId\('([^']+)'", assignment["scope"])
        assigned[role_id] = (ROLES.get(role_id, ("?",))[0], scope_kind)
        assert properties["principalType"] == "ServicePrincipal"
        assert properties["principalId"] == "[parameters('given').principalId]"
        assert "parameters('given').principalId" in assignment["name"]
        assert role in assignment["name"]
    assert assigned == ROLES
    [site] = resources("Microsoft.Web/sites")
    assert any("Microsoft.Resources/deployments" in d for d in site["dependsOn"])


def test_the_role_assignments_are_valid_by_microsofts_schemas() -> None:
    inner = role_deployment()["properties"]["template"]
    assert arm.errors(inner, arm.TEMPLATE_SCHEMA) == []
    assert [e for r in inner["resources"] for e in arm.resource_errors(r)] == []


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
    vault = "https://kvuuuuuuuuuuuuu.vault.azure.net/secrets/"
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
    assert TEMPLATE["parameters"]["createPostgresServer"]["defaultValue"] is True
    assert server["properties"]["authConfig"]["passwordAuth"] == "Disabled"
    assert server["properties"]["authConfig"]["activeDirectoryAuth"] == "Enabled"
    assert "administratorLogin" not in server["properties"]


# --- Monitoring -------------------------------------------------------------------------------


def test_logs_and_insights_take_microsoft_entra_sign_in_only() -> None:
    [workspace] = resources("Microsoft.OperationalInsights/workspaces")
    assert workspace["properties"]["features"]["disableLocalAuth"] is True
    [insights] = resources("Microsoft.Insights/components")
    assert insights["properties"]["DisableLocalAuth"] is True


def alert(key: str) -> dict[str, Any]:
    [rule] = [
        r
        for r in resources("Microsoft.Insights/scheduledQueryRules")
        if f"-{key}-" in expressions().value(r["name"])
    ]
    return rule


def condition_of(rule: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    [condition] = expressions(**parameters).value(rule["properties"]["criteria"]["allOf"])
    return dict(condition)


def test_the_backlog_alert_reads_the_gauge_the_relay_emits() -> None:
    sdk = Sdk.start()
    telemetry = sdk.telemetry()
    telemetry.record_backlog(Backlog(counts={"Pending": 3}, oldest_unpublished_age_seconds=1200.0))
    [point] = sdk.points("outbox.backlog.oldest_unpublished_age")
    assert point.value == 1200.0
    condition = condition_of(alert("backlog-age"))
    assert "where name == 'outbox.backlog.oldest_unpublished_age'" in condition["query"]
    assert condition["metricMeasureColumn"] in condition["query"]
    assert (condition["operator"], condition["timeAggregation"]) == ("GreaterThan", "Maximum")
    # One threshold for the alert and for `status`'s healthy/unhealthy.
    assert condition_of(alert("backlog-age"), alertOldestPendingSeconds=600)["threshold"] == 600
    assert (
        app_settings(alertOldestPendingSeconds=600)["OUTBOX_ALERT_OLDEST_PENDING_SECONDS"] == "600"
    )


def test_an_app_that_stops_reporting_raises_an_alert() -> None:
    # The timer sweep records the gauge every five minutes: none in twenty is a relay down.
    rule = alert("sweeps-missing")
    condition = condition_of(rule)
    assert "where name == 'outbox.backlog.oldest_unpublished_age'" in condition["query"]
    assert "summarize points = count()" in condition["query"]  # a row even when none came
    assert (condition["operator"], condition["threshold"]) == ("LessThan", 1)
    assert rule["properties"]["windowSize"] == "PT20M"
    schedule = indexing.EXPECTED["outbox_timer"][0]["schedule"]
    assert schedule == "0 */5 * * * *"


def test_failing_invocations_raise_an_alert() -> None:
    condition = condition_of(alert("failures"))
    assert "requests" in condition["query"]
    assert "success == false" in condition["query"]
    assert "cloud_RoleName =~ 'outbox-uuuuuuuuuuuuu'" in condition["query"]  # the app's name
    assert (condition["operator"], condition["threshold"]) == ("GreaterThan", 0)


def test_every_alert_mails_the_action_group_when_one_is_given() -> None:
    for rule in resources("Microsoft.Insights/scheduledQueryRules"):
        actions = expressions(alertEmail="oncall@x.io").value(rule["properties"]["actions"])
        assert len(actions["actionGroups"]) == 1
        assert expressions().value(rule["properties"]["actions"]) == {"actionGroups": []}


def test_logs_of_the_app_the_vault_the_queue_and_the_server_go_to_the_workspace() -> None:
    scopes = {
        re.findall(r"resourceId\('([^']+)'", r["scope"])[0]
        for r in resources("Microsoft.Insights/diagnosticSettings")
    }
    assert scopes == {
        "Microsoft.Web/sites",
        "Microsoft.KeyVault/vaults",
        "Microsoft.Storage/storageAccounts/queueServices",
        "Microsoft.DBforPostgreSQL/flexibleServers",
    }


# --- Networks and production defaults ---------------------------------------------------------


def public_access(**parameters: Any) -> dict[str, str]:
    values = expressions(**parameters)
    [account] = resources("Microsoft.Storage/storageAccounts")
    [vault] = resources("Microsoft.KeyVault/vaults")
    [server] = resources("Microsoft.DBforPostgreSQL/flexibleServers")
    return {
        "storage": values.value(account["properties"]["publicNetworkAccess"]),
        "vault": values.value(vault["properties"]["publicNetworkAccess"]),
        "postgres": values.value(server["properties"]["network"]["publicNetworkAccess"]),
    }


def private_endpoints(**parameters: Any) -> dict[str, list[str]]:
    values = expressions(**parameters)
    made: dict[str, list[str]] = {}
    for endpoint in resources("Microsoft.Network/privateEndpoints"):
        if not values.value(endpoint["condition"]):
            continue
        [link] = endpoint["properties"]["privateLinkServiceConnections"]
        kind = re.findall(r"resourceId\('([^']+)'", link["properties"]["privateLinkServiceId"])[0]
        made.setdefault(kind, []).extend(link["properties"]["groupIds"])
    return made


def test_by_default_storage_the_vault_and_postgres_are_reached_privately() -> None:
    assert public_access() == {"storage": "Disabled", "vault": "Disabled", "postgres": "Disabled"}
    assert private_endpoints() == {
        "Microsoft.Storage/storageAccounts": ["blob", "queue"],
        "Microsoft.KeyVault/vaults": ["vault"],
        "Microsoft.DBforPostgreSQL/flexibleServers": ["postgresqlServer"],
    }
    [site] = resources("Microsoft.Web/sites")
    subnet = expressions().value(site["properties"]["virtualNetworkSubnetId"])
    assert subnet == "<id Microsoft.Network/virtualNetworks/subnets outbox-vnet-uuuuuuuuuuuuu/app>"
    [network] = resources("Microsoft.Network/virtualNetworks")
    [app_subnet] = [s for s in network["properties"]["subnets"] if "appSubnet" in s["name"]]
    [delegation] = app_subnet["properties"]["delegations"]
    assert delegation["properties"]["serviceName"] == "Microsoft.App/environments"  # Flex's
    zones = {expressions().value(z["name"]) for z in resources("Microsoft.Network/privateDnsZones")}
    assert zones == {
        "privatelink.blob.core.windows.net",
        "privatelink.queue.core.windows.net",
        "privatelink.vaultcore.azure.net",
        "privatelink.postgres.database.azure.com",
    }


def test_postgres_admits_the_admins_address_and_never_every_azure_tenant_on_a_network() -> None:
    assert public_access(clientIpAddress="203.0.113.7")["postgres"] == "Enabled"
    rules = {
        expressions().value(r["name"]).rsplit("/", 1)[1]: r
        for r in resources("Microsoft.DBforPostgreSQL/flexibleServers/firewallRules")
    }
    assert set(rules) == {"AllowAzureServices", "ClientIpAddress"}
    everyone = rules["AllowAzureServices"]["condition"]
    assert not expressions().value(everyone)  # vnetEnabled (the default): not made
    # Without a network, Flex Consumption has no fixed outbound address: Azure's is admitted.
    assert expressions(vnetEnabled=False).value(everyone)
    assert public_access(vnetEnabled=False) == {
        "storage": "Enabled",
        "vault": "Enabled",
        "postgres": "Enabled",
    }
    assert private_endpoints(vnetEnabled=False) == {}


def test_high_availability_and_backups_are_parameters() -> None:
    [server] = resources("Microsoft.DBforPostgreSQL/flexibleServers")
    given = {
        "postgresSkuName": "Standard_D2ds_v5",
        "postgresHighAvailability": "ZoneRedundant",
        "postgresBackupRetentionDays": 35,
        "postgresGeoRedundantBackup": "Enabled",
    }
    properties = expressions(**given).value(server["properties"])
    assert properties["highAvailability"] == {"mode": "ZoneRedundant"}
    assert properties["backup"] == {"backupRetentionDays": 35, "geoRedundantBackup": "Enabled"}
    assert expressions(**given).value(server["sku"]) == {
        "name": "Standard_D2ds_v5",
        "tier": "GeneralPurpose",
    }
    # A standby on a Burstable server is refused at the start, saying why.
    with pytest.raises(arm.TemplateError, match="postgresHighAvailability needs"):
        expressions(postgresHighAvailability="SameZone").value(server["properties"])


def test_the_vault_keeps_deleted_secrets_and_gets_a_new_name_when_asked() -> None:
    [vault] = resources("Microsoft.KeyVault/vaults")
    assert vault["properties"]["enablePurgeProtection"] is True
    assert vault["properties"]["softDeleteRetentionInDays"] == 90
    name = expressions().value(vault["name"])
    assert len(name) <= 24
    assert TEMPLATE["variables"]["vaultName"].count("keyVaultGeneration") == 1


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"createPostgresServer": False}, "databaseHost is required"),
        ({"postgresAdminName": ""}, "postgresAdminObjectId and postgresAdminName are required"),
        ({"postgresAdminObjectId": ""}, "postgresAdminObjectId and postgresAdminName are required"),
    ],
)
def test_missing_required_values_fail_at_the_start_naming_them(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(arm.TemplateError, match=message):
        expressions(**given).value(TEMPLATE["variables"])
    # The administrators' child name is always well formed, whatever the condition.
    [admin] = resources("Microsoft.DBforPostgreSQL/flexibleServers/administrators")
    name = expressions(createPostgresServer=False, databaseHost="db.x.io").value(admin["name"])
    assert name.split("/")[1]


def test_the_parameters_file_holds_no_placeholder_and_deploys_as_it_is() -> None:
    text = json.dumps(PARAMETERS)
    assert "00000000-0000-0000-0000-000000000000" not in text
    assert "example.com" not in text
    # Its values and the defaults (the deployer as PostgreSQL's administrator) evaluate whole.
    values = expressions()
    values.value(TEMPLATE["variables"])
    for resource in TEMPLATE["resources"]:
        values.value({k: v for k, v in resource.items() if k != "properties"})
    assert values.value(TEMPLATE["variables"]["postgresAdmin"]) == arm.DEPLOYER["objectId"]
    assert TEMPLATE["parameters"]["postgresAdminName"]["defaultValue"] == (
        "[deployer().userPrincipalName]"
    )


def test_the_gauge_the_alerts_read_goes_silent_when_the_sweeps_stop() -> None:
    # A relay whose sweeps fail (its database gone) must not keep reporting its last figure: the
    # alert on missing points fires instead of the age alert reading a stale value.
    sdk = Sdk.start()
    telemetry = sdk.telemetry()
    now = [1000.0]
    telemetry.clock = lambda: now[0]
    telemetry.record_backlog(Backlog(counts={"Pending": 3}, oldest_unpublished_age_seconds=12.0))
    assert [p.value for p in sdk.points("outbox.backlog.oldest_unpublished_age")] == [12.0]
    now[0] += 300  # the next sweep is due, and fails
    assert [p.value for p in sdk.points("outbox.backlog.oldest_unpublished_age")] == [12.0]
    now[0] += 200  # past BACKLOG_FRESH_SECONDS: nothing reported any more
    assert sdk.points("outbox.backlog.oldest_unpublished_age") == []
    assert sdk.points("outbox.backlog.messages") == []
    telemetry.record_backlog(Backlog(counts={"Pending": 0}, oldest_unpublished_age_seconds=None))
    assert [p.value for p in sdk.points("outbox.backlog.oldest_unpublished_age")] == [0.0]
