"""The app as Flex Consumption runs it on Python 3.13: built as the remote build builds it
(requirements.txt alone) and loaded under Microsoft's worker runtime, ``azure-functions-runtime``,
with the host's side played by ``tests/support/functions_worker/host.py``. No database or storage:
these check what the platform does with the package itself."""

from __future__ import annotations

from importlib.metadata import distributions

import pytest

from tests.support.azure import free_port
from tests.support.deployment import DeployedApp, FunctionsWorker, build_app, deployed_python
from tests.support.indexing import EXPECTED


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> DeployedApp:
    return build_app(tmp_path_factory.mktemp("flex"), deployed_python())


async def test_the_built_app_indexes_under_microsofts_runtime_with_the_expected_bindings(
    deployed: DeployedApp,
) -> None:
    async with FunctionsWorker(deployed, {}) as worker:
        functions = worker.functions
    assert worker.returncode == 0, worker.stderr
    assert worker.python_version.startswith("3.13.")
    # The runtime the platform's worker loads is the one the app's requirements.txt pins.
    assert worker.runtime_path.is_relative_to(deployed.site_packages)
    assert sorted(functions) == sorted(EXPECTED)
    for name, bindings in functions.items():
        assert bindings == EXPECTED[name], name


async def test_the_console_page_answers_without_settings_or_key(deployed: DeployedApp) -> None:
    async with FunctionsWorker(deployed, {}) as worker:
        result = await worker.invoke_http("outbox_console", "GET", "/api/outbox/console")
    assert (result.status, result.exception) == ("Success", None)
    assert result.http is not None
    assert result.http.status == 200
    assert (result.http.header("Content-Type") or "").startswith("text/html")
    assert "<html" in result.http.body.lower()
    assert (
        "INFO azure.functions: Function name: outbox_console, Function Type: async" in result.logs
    )


async def test_the_status_answers_503_in_json_when_the_database_refuses(
    deployed: DeployedApp,
) -> None:
    settings = {
        "OUTBOX_DATABASE_URL": f"postgresql://u@127.0.0.1:{free_port()}/db",
        "OUTBOX_QUEUE_NAME": "outbox-wakeup",
    }
    async with FunctionsWorker(deployed, settings) as worker:
        result = await worker.invoke_http("outbox_status", "GET", "/api/outbox/status")
    assert result.status == "Success", result.stack_trace
    assert result.http is not None
    assert result.http.status == 503
    assert result.http.header("Content-Type") == "application/json"
    assert "error" in result.http.json()
    assert "Traceback" not in result.http.body


def test_the_remote_build_installs_requirements_txt_and_nothing_else(
    deployed: DeployedApp,
) -> None:
    installed = {
        d.metadata["Name"].lower(): d.version
        for d in distributions(path=[str(deployed.site_packages)])
    }
    assert installed["azure-functions-runtime"] == "1.3.0"
    assert {"azure-identity", "azure-monitor-opentelemetry"} <= installed.keys()
    assert "pytest" not in installed
    assert not (deployed.site_packages / "pytest").exists()
    assert sorted(p.name for p in deployed.app.iterdir()) == sorted(
        [
            ".python_packages",
            "function_app.py",
            "host.json",
            "migrations",
            "outbox",
            "requirements.txt",
        ]
    )
