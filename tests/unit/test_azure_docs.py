"""docs/azure.md's deployment sequence names only what exists: the template's parameters and
outputs, the CLI's commands and flags, the settings the relay or the platform reads."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from outbox.core.settings import Settings, env_name
from outbox.hosting.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "azure.md").read_text()
TEMPLATE = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())
# What the platform and its SDKs read (the template sets them, or Azure does).
PLATFORM = {
    "AzureWebJobsStorage",
    "AzureWebJobsStorage__accountName",
    "AzureWebJobsStorage__blobServiceUri",
    "AzureWebJobsStorage__queueServiceUri",
    "AzureWebJobsStorage__credential",
    "AzureWebJobsStorage__clientId",
    "AZURE_CLIENT_ID",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "WEBSITE_SKU",
}


def shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", DOC, re.DOTALL)


def commands() -> list[str]:
    """Every command of the shell blocks, continuation lines joined."""
    joined = [block.replace("\\\n", " ") for block in shell_blocks()]
    return [line.strip() for block in joined for line in block.splitlines() if line.strip()]


def test_the_sequence_starts_with_the_group_and_ends_with_a_webhook() -> None:
    lines = commands()
    order = [
        next(i for i, line in enumerate(lines) if marker in line)
        for marker in (
            "az group create",
            "az deployment group create",
            "python -m outbox migrate",
            "python -m outbox grant",
            "az functionapp deployment source config-zip",
            "python -m outbox enqueue",
            "/api/outbox/drain",
        )
    ]
    assert order == sorted(order)


def test_every_parameter_given_is_the_templates() -> None:
    given: set[str] = set()
    for line in commands():
        if "az deployment group create" in line:
            given |= set(re.findall(r"\b([A-Za-z]+)=", line.split("--parameters", 1)[1]))
    assert given == {"clientIpAddress", "alertEmail"}
    assert given <= set(TEMPLATE["parameters"])
    [file] = re.findall(r"cat > webhooks\.parameters\.json <<'JSON'\n(.*?)\nJSON", DOC, re.DOTALL)
    assert set(json.loads(file)["parameters"]) <= set(TEMPLATE["parameters"])
    # The secret travels in a file, never on the command line.
    assert not any("webhooks=" in line for line in commands())


def test_every_output_read_is_one_the_template_has() -> None:
    read = {name for line in commands() for name in re.findall(r"\$\(out (\w+)\)", line)}
    assert read >= {"databaseHost", "databaseName", "identityName", "identityPrincipalId"}
    assert read <= set(TEMPLATE["outputs"])


def python_commands() -> list[list[str]]:
    found = []
    for line in commands():
        if line.startswith("python -m outbox "):
            words = shlex.split(re.sub(r"\$\([^)]*\)|\$\{[^}]*\}|\$\w+", "x", line))
            found.append(words[3:])
    return found


@pytest.mark.parametrize("args", python_commands(), ids=lambda a: a[0])
def test_every_outbox_command_parses_with_the_clis_own_parser(args: list[str]) -> None:
    build_parser().parse_args(args)  # SystemExit (a test failure) for a name it does not know


def test_every_setting_the_docs_tell_users_to_set_is_read_by_something() -> None:
    relay = {env_name(field) for field in Settings.model_fields}
    named = set(re.findall(r"\b((?:OUTBOX|AzureWebJobsStorage|APPLICATIONINSIGHTS)\w*)", DOC))
    named |= {n for n in re.findall(r"\b(AZURE_CLIENT_ID|WEBSITE_SKU)\b", DOC)}
    assert named - relay - PLATFORM == set()
    exported = {m for line in commands() for m in re.findall(r"export (\w+)=", line)}
    assert exported <= relay
