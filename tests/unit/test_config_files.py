"""host.json, local.settings.json.example, requirements.txt and .funcignore, checked as files."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from outbox.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT.parent / "shared" / "schemas"
# Settings whose default follows the hosting plan (outbox.core.settings.default_concurrency).
PLAN_DEPENDENT = {"concurrency"}
SCHEMA_FILES = {
    "host.json": "host.schema.json",
    "local.settings.json.example": "local.settings.schema.json",
}


def load(name: str) -> Any:
    return json.loads((ROOT / name).read_text())


def schema_for(name: str) -> Any:
    """The published SchemaStore schema: the shared copy if present, else tests/schemas."""
    for folder in (SCHEMAS, ROOT / "tests" / "schemas"):
        path = folder / SCHEMA_FILES[name]
        if path.exists():
            return json.loads(path.read_text())
    raise FileNotFoundError(SCHEMA_FILES[name])


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES))
def test_file_validates_against_the_published_schema(name: str) -> None:
    schema = schema_for(name)
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [e.message for e in validator.iter_errors(load(name))]
    assert errors == []


@pytest.mark.parametrize("name", sorted(SCHEMA_FILES))
def test_the_schema_check_would_catch_a_mistake(name: str) -> None:
    schema = schema_for(name)
    broken = load(name)
    if name == "host.json":
        broken["extensions"]["queues"]["messageEncoding"] = "utf8"
    else:
        broken["IsEncrypted"] = "no"
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert list(validator.iter_errors(broken))


def test_host_json_keeps_queue_encoding_polling_and_timeout_as_chosen() -> None:
    host = load("host.json")
    queues = host["extensions"]["queues"]
    assert host["version"] == "2.0"
    assert host["extensionBundle"] == {
        "id": "Microsoft.Azure.Functions.ExtensionBundle",
        "version": "[4.*, 5.0.0)",
    }
    assert queues["messageEncoding"] == "base64"  # what notify() sends
    assert queues["maxPollingInterval"] == "00:00:01"
    assert queues["maxDequeueCount"] == 5
    assert host["functionTimeout"] == "00:10:00"


def test_run_budget_plus_a_lease_stays_well_inside_the_function_timeout() -> None:
    hours, minutes, seconds = (int(p) for p in load("host.json")["functionTimeout"].split(":"))
    timeout = hours * 3600 + minutes * 60 + seconds
    example = load("local.settings.json.example")["Values"]
    longest_run = float(example["OUTBOX_RUN_BUDGET_SECONDS"]) + float(
        example["OUTBOX_LEASE_SECONDS"]
    )
    assert longest_run <= timeout / 2
    assert Settings.model_fields["run_budget_seconds"].default == float(
        example["OUTBOX_RUN_BUDGET_SECONDS"]
    )


def test_example_settings_cover_every_setting_and_load() -> None:
    values = load("local.settings.json.example")["Values"]
    assert values["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert values["AzureWebJobsStorage"] == "UseDevelopmentStorage=true"
    assert values["OUTBOX_QUEUE_NAME"] == "outbox-wakeup"
    # Every setting that has a value by default; those unset by default stay out of it, and so
    # does one whose default follows the hosting plan (a value here would pin it).
    documented = {
        f"OUTBOX_{name.upper()}"
        for name, field in Settings.model_fields.items()
        if not name.startswith("queue_")
        and name not in PLAN_DEPENDENT
        and (field.is_required() or field.default is not None)
    }
    assert "OUTBOX_CONCURRENCY" not in values
    assert documented | {"OUTBOX_QUEUE_NAME"} == {k for k in values if k.startswith("OUTBOX_")}
    settings = Settings.load(
        **{
            k.removeprefix("OUTBOX_").lower(): v
            for k, v in values.items()
            if k.startswith("OUTBOX_")
        },
        queue_connection=values["AzureWebJobsStorage"],
    )
    [endpoint] = settings.endpoints["OrderCompleted"]
    assert endpoint.signing_keys


def test_local_settings_json_is_not_committed() -> None:
    assert "local.settings.json" in (ROOT / ".gitignore").read_text().split()


def test_requirements_are_runtime_only_and_never_the_old_worker() -> None:
    # What they hold is tests/unit/test_requirements.py's; here, what they must never hold:
    # the platform's worker for Python 3.12 and older (Microsoft: "DO NOT include
    # azure-functions-worker"), or any test or build tool.
    names = {
        line.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip().lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert "azure-functions" in names
    assert names.isdisjoint({"azure-functions-worker", "pytest", "mypy", "ruff", "setuptools"})


@pytest.mark.parametrize(
    ("path", "deployed"),
    [
        ("function_app.py", True),
        ("host.json", True),
        ("requirements.txt", True),
        ("outbox/relay/processor.py", True),
        ("outbox/store/queries.sql", True),
        ("migrations/0001_create_outbox_messages.sql", True),
        ("tests/conftest.py", False),
        ("tools/package.json", False),
        ("examples/functions_receiver.py", False),
        (".venv/bin/python", False),
        ("local.settings.json", False),
        ("requirements-dev.txt", False),
        ("README.md", False),
        (".local/pgdata/PG_VERSION", False),
        # What `pip install .` leaves in the checkout: a publish from it must not ship them.
        ("build/lib/outbox/relay/processor.py", False),
        ("outbox_relay.egg-info/PKG-INFO", False),
        ("infra/azuredeploy.json", False),
    ],
)
def test_funcignore_keeps_tests_and_tooling_out_of_the_package(path: str, deployed: bool) -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".funcignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    folders = ["/".join(parts[: i + 1]) + "/" for i in range(len(parts) - 1)]
    ignored = any(fnmatch.fnmatch(candidate, p) for p in patterns for candidate in [path, *folders])
    assert ignored is not deployed


def test_example_settings_are_the_documented_defaults() -> None:
    values = load("local.settings.json.example")["Values"]
    examples = {"OUTBOX_DATABASE_URL", "OUTBOX_WEBHOOKS"}  # no default: values to start from
    for name, field in Settings.model_fields.items():
        setting = f"OUTBOX_{name.upper()}"
        if setting in values and setting not in examples:
            assert type(field.default)(values[setting]) == field.default, setting
