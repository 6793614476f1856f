"""Flex Consumption's documented rules (tests/platform/flex-consumption.json, each row with its
Microsoft Learn source) held against the template and against every setting the docs tell users
to set: a schema accepts what the platform rejects."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import arm

ROOT = Path(__file__).resolve().parents[2]
RULES = json.loads((ROOT / "tests" / "platform" / "flex-consumption.json").read_text())
TEMPLATE = json.loads((ROOT / "infra" / "azuredeploy.json").read_text())
PARAMETERS = json.loads((ROOT / "infra" / "azuredeploy.parameters.json").read_text())
UNSUPPORTED_SETTINGS = {row["name"] for row in RULES["unsupportedAppSettings"]}
UNSUPPORTED_PROPERTIES = {row["name"].lower() for row in RULES["unsupportedSiteProperties"]}


def sites(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in template["resources"] if r["type"] == "Microsoft.Web/sites"]


def site_property_names(site: dict[str, Any]) -> Iterator[str]:
    """The site's properties, and its siteConfig's, where the table's names live."""
    properties = site["properties"]
    yield from properties
    yield from properties.get("siteConfig", {})


def broken_site_rules(template: dict[str, Any]) -> list[str]:
    found = []
    for site in sites(template):
        found += [n for n in site_property_names(site) if n.lower() in UNSUPPORTED_PROPERTIES]
        settings = site["properties"].get("siteConfig", {}).get("appSettings", [])
        found += [s["name"] for s in settings if s["name"] in UNSUPPORTED_SETTINGS]
    return found


def test_every_rule_names_its_microsoft_learn_source() -> None:
    rows = [*RULES["unsupportedAppSettings"], *RULES["unsupportedSiteProperties"]]
    rows += [*RULES["values"], *RULES["plan"], RULES["scaleGroups"]]
    for row in rows:
        assert row["source"].startswith("https://learn.microsoft.com/azure/"), row
    assert len(RULES["unsupportedAppSettings"]) == 20
    assert len(RULES["unsupportedSiteProperties"]) == 18


def test_the_template_sets_no_site_property_or_app_setting_flex_does_not_support() -> None:
    assert broken_site_rules(TEMPLATE) == []


@pytest.mark.parametrize(
    ("where", "name", "value"),
    [
        ("siteConfig", "ftpsState", "Disabled"),
        ("siteConfig", "alwaysOn", False),
        ("properties", "containerSize", 1536),
    ],
)
def test_the_check_catches_a_property_flex_rejects(where: str, name: str, value: Any) -> None:
    broken = copy.deepcopy(TEMPLATE)
    [site] = sites(broken)
    target = site["properties"]["siteConfig"] if where == "siteConfig" else site["properties"]
    target[name] = value
    assert broken_site_rules(broken) == [name]
    # Microsoft's schema takes it: only the rule table says no.
    assert arm.resource_errors(site) == []


def test_the_check_catches_a_setting_flex_deprecates() -> None:
    broken = copy.deepcopy(TEMPLATE)
    [site] = sites(broken)
    site["properties"]["siteConfig"]["appSettings"].append(
        {"name": "FUNCTIONS_WORKER_RUNTIME", "value": "python"}
    )
    assert broken_site_rules(broken) == ["FUNCTIONS_WORKER_RUNTIME"]


def resolved(**parameters: Any) -> dict[str, Any]:
    given = {name: spec["value"] for name, spec in PARAMETERS["parameters"].items()}
    [site] = sites(TEMPLATE)
    values: dict[str, Any] = arm.Expressions(TEMPLATE, {**given, **parameters}).value(site)
    return values


def at(node: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("python", TEMPLATE["parameters"]["pythonVersion"]["allowedValues"])
@pytest.mark.parametrize("memory", TEMPLATE["parameters"]["instanceMemoryMB"]["allowedValues"])
def test_the_values_the_template_allows_are_ones_flex_takes(python: str, memory: int) -> None:
    site = resolved(pythonVersion=python, instanceMemoryMB=memory)
    for rule in RULES["values"]:
        if any(at(site, path) != value for path, value in rule.get("when", {}).items()):
            continue
        value = at(site, rule["path"])
        if "allowed" in rule:
            assert value in rule["allowed"], rule["path"]
        else:
            assert rule["minimum"] <= value <= rule["maximum"], rule["path"]


def test_the_lowest_maximum_the_template_assumes_is_the_documented_one() -> None:
    [rule] = [r for r in RULES["values"] if r["path"].endswith("maximumInstanceCount")]
    parameter = TEMPLATE["parameters"]["lowestMaximumInstanceCount"]
    assert parameter["defaultValue"] == parameter["maxValue"] == rule["minimum"]


def test_the_plan_is_what_flex_needs() -> None:
    plans = [r for r in TEMPLATE["resources"] if r["type"] == "Microsoft.Web/serverfarms"]
    [plan] = plans
    [sku] = [r for r in RULES["plan"] if r["rule"] == "sku"]
    [reserved] = [r for r in RULES["plan"] if r["rule"] == "reserved"]
    assert plan["sku"] == sku["value"]
    assert plan["properties"]["reserved"] is reserved["value"]
    assert len(sites(TEMPLATE)) == 1  # one app per plan


# --- What the docs tell users to set ----------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A line may name such a setting only to say it is not for Flex Consumption.
SAYS_NOT = re.compile(r"\b(not|deprecated|invalid|never)\b", re.IGNORECASE)


def test_the_docs_never_tell_a_flex_user_to_set_what_flex_does_not_support() -> None:
    names = UNSUPPORTED_SETTINGS | {r["name"] for r in RULES["unsupportedSiteProperties"]}
    pattern = re.compile(r"`(" + "|".join(sorted(map(re.escape, names))) + r")\b")
    offending = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if pattern.search(line) and not ("Flex" in line and SAYS_NOT.search(line)):
                offending.append(f"{doc.name}:{number}: {line.strip()[:120]}")
    assert offending == []


def test_the_local_settings_example_with_its_core_tools_setting_is_never_deployed() -> None:
    # FUNCTIONS_WORKER_RUNTIME is what Core Tools needs on a laptop; .funcignore keeps the file
    # out of the package Flex builds.
    example = json.loads((ROOT / "local.settings.json.example").read_text())
    assert example["Values"]["FUNCTIONS_WORKER_RUNTIME"] == "python"
    ignored = (ROOT / ".funcignore").read_text().splitlines()
    assert "local.settings.json.example" in ignored
    assert "local.settings.json" in ignored
