"""The GitHub workflows: valid by SchemaStore's published schema (a copy in tests/schemas), the CI
one running what .ci/run runs, the deploy one signing in without a stored secret."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "github-workflow.json").read_text())


def load(path: Path) -> dict[str, Any]:
    # YAML 1.1 reads the key `on` as True: the schema wants the string.
    document: dict[Any, Any] = yaml.safe_load(path.read_text())
    if True in document:
        document["on"] = document.pop(True)
    return document


def workflow(name: str) -> dict[str, Any]:
    return load(ROOT / ".github" / "workflows" / name)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_each_workflow_is_valid_by_schemastores_schema(path: Path) -> None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    assert [e.message for e in validator.iter_errors(load(path))] == []


def test_the_schema_check_would_catch_a_mistake() -> None:
    broken = workflow("ci.yml")
    broken["jobs"]["ci"]["runs-on"] = 42
    broken["permissions"] = {"contents": "everything"}
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(broken))


def steps(document: dict[str, Any], job: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = document["jobs"][job]["steps"]
    return found


def test_ci_runs_what_ci_run_runs_beside_the_services_it_needs() -> None:
    ci = workflow("ci.yml")
    assert [s.get("run") for s in steps(ci, "ci")][-1] == "bash .ci/run"
    postgres = ci["jobs"]["ci"]["services"]["postgres"]
    assert postgres["ports"] == ["5432:5432"]
    assert postgres["env"]["POSTGRES_HOST_AUTH_METHOD"] == "trust"
    pythons = next(
        s for s in steps(ci, "ci") if s.get("uses", "").startswith("actions/setup-python")
    )
    assert {"3.11", "3.13"} <= set(pythons["with"]["python-version"].split())
    assert any(s.get("uses", "").startswith("actions/setup-node") for s in steps(ci, "ci"))
    assert ci["permissions"] == {"contents": "read"}


def test_deploy_signs_in_with_openid_connect_and_uses_no_stored_secret() -> None:
    text = (ROOT / ".github" / "workflows" / "deploy.yml").read_text()
    deploy = workflow("deploy.yml")
    assert deploy["permissions"] == {"id-token": "write", "contents": "read"}
    [login] = [s for s in steps(deploy, "deploy") if s.get("uses", "").startswith("azure/login@")]
    assert set(login["with"]) == {"client-id", "tenant-id", "subscription-id"}
    assert "secrets." not in text
    assert "client-secret" not in text
    assert "creds:" not in text


def test_deploy_follows_the_documented_sequence() -> None:
    runs = " ".join(s.get("run", "") for s in steps(workflow("deploy.yml"), "deploy"))
    order = [
        runs.index(step)
        for step in (
            "az deployment group create",
            "python -m outbox migrate",
            "python -m outbox grant",
            "az functionapp deployment source config-zip",
        )
    ]
    assert order == sorted(order)
    template = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())
    given = set(re.findall(r"\b(postgres\w+|clientIpAddress)=", runs))
    assert given == {
        "postgresAdminObjectId",
        "postgresAdminName",
        "postgresAdminType",
        "clientIpAddress",
    }
    assert given <= set(template["parameters"])
    read = set(re.findall(r"outputs\.(\w+)\.value|\$\(out (\w+)\)", runs))
    outputs = {name for pair in read for name in pair if name}
    assert outputs <= set(template["outputs"])
