"""requirements.txt (what the Flex build installs), pyproject.toml (the package) and the template's
app settings (what the deployed app must be able to do) agree."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
TEMPLATE = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())

# The extras each app setting of the template needs, and why.
NEEDS = {
    "OUTBOX_DATABASE_AUTH": "azure",  # entra: a token from azure-identity
    "AzureWebJobsStorage__credential": "azure",  # the hint clients' managed identity
    "APPLICATIONINSIGHTS_CONNECTION_STRING": "azure-monitor",  # configure_azure_monitor()
}
WORKER_RUNTIME = "azure-functions-runtime"


def deployed() -> list[Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def by_name(requirements: list[Requirement]) -> dict[str, str]:
    return {canonicalize_name(r.name): str(r) for r in requirements}


def template_settings() -> set[str]:
    [site] = [r for r in TEMPLATE["resources"] if r["type"] == "Microsoft.Web/sites"]
    return {pair["name"] for pair in site["properties"]["siteConfig"]["appSettings"]}


def test_requirements_txt_is_the_package_plus_the_extras_the_templates_settings_need() -> None:
    extras = {NEEDS[name] for name in template_settings() if name in NEEDS}
    assert extras == {"azure", "azure-monitor"}
    wanted = [Requirement(r) for r in PROJECT["dependencies"]]
    for extra in sorted(extras):
        wanted += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
    given = by_name(deployed())
    given.pop(WORKER_RUNTIME)
    assert given == by_name(wanted)


def test_the_worker_runtime_is_pinned_for_the_python_the_template_deploys() -> None:
    [runtime] = [r for r in deployed() if r.name == WORKER_RUNTIME]
    [pinned] = runtime.specifier
    assert pinned.operator == "=="
    python = TEMPLATE["parameters"]["pythonVersion"]["defaultValue"]
    assert runtime.marker is not None
    assert runtime.marker.evaluate({"python_version": python})
    assert not runtime.marker.evaluate({"python_version": "3.12"})  # the host's own worker there


def test_the_azure_monitor_extra_reads_the_templates_entra_sign_in() -> None:
    # APPLICATIONINSIGHTS_AUTHENTICATION_STRING is read by the exporter from 1.0.0b36 on, which
    # azure-monitor-opentelemetry requires from 1.6.11 on.
    [distro] = [Requirement(r) for r in PROJECT["optional-dependencies"]["azure-monitor"]]
    assert "APPLICATIONINSIGHTS_AUTHENTICATION_STRING" in template_settings()
    lowest = min(Version(s.version) for s in distro.specifier if s.operator == ">=")
    assert lowest >= Version("1.6.11")


def test_every_python_the_template_allows_is_one_the_package_declares() -> None:
    allowed = TEMPLATE["parameters"]["pythonVersion"]["allowedValues"]
    declared = {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if "Python :: 3." in c}
    assert set(allowed) <= declared
