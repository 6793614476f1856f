"""Settings are built once at the edge (a command, serve, make run, the Functions side's host) and
passed down: no module of the package keeps them in a module global."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from outbox.azure.host import FunctionsHost
from outbox.core.errors import ConfigurationError
from outbox.core.settings import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "outbox"


def _mentions_settings(node: ast.AST | None) -> bool:
    return node is not None and any(
        isinstance(name, ast.Name | ast.Attribute)
        and (name.id if isinstance(name, ast.Name) else name.attr).endswith("Settings")
        for name in ast.walk(node)
    )


def _loads_settings(node: ast.AST | None) -> bool:
    """``node`` holds a call that builds settings: ``Settings.load()``, ``QueueSettings(...)``."""
    return node is not None and any(
        isinstance(call, ast.Call) and _mentions_settings(call.func) for call in ast.walk(node)
    )


def settings_globals(module: str, source: str) -> list[str]:
    """Each module-level name of ``source`` that holds settings, said in one line: annotated as
    settings or assigned built ones at the top level, or assigned them under ``global``."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and (
            _mentions_settings(node.annotation) or _loads_settings(node.value)
        ):
            found.append(f"{module}:{node.lineno} {ast.unparse(node.target)}")
        elif isinstance(node, ast.Assign) and _loads_settings(node.value):
            found.append(f"{module}:{node.lineno} {ast.unparse(node.targets[0])}")
    declared = {
        name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _loads_settings(node.value):
            names = {t.id for t in node.targets if isinstance(t, ast.Name)} & declared
            found += [f"{module}:{node.lineno} global {name}" for name in sorted(names)]
    return sorted(set(found))


def test_no_module_of_the_package_keeps_settings_in_a_global() -> None:
    kept = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in settings_globals(str(path.relative_to(PACKAGE.parent)), path.read_text())
    ]
    assert kept == []


@pytest.mark.parametrize(
    "source",
    [
        "_settings: Settings | None = None",  # what outbox.relay.runtime kept before
        "SETTINGS = Settings.load()",
        "queue = QueueSettings.load(queue_name='x')",
        "_s = None\ndef get():\n    global _s\n    if _s is None:\n        _s = Settings.load()\n",
    ],
)
def test_a_settings_global_is_caught(source: str) -> None:
    [kept] = settings_globals("outbox.example", source)
    assert kept.startswith("outbox.example:")


def test_settings_passed_down_are_not_caught() -> None:
    source = (
        "def run(settings: Settings) -> None:\n    queue = QueueSettings.load()\n"
        "class Host:\n    def __init__(self) -> None:\n"
        "        self._settings: Settings | None = None\n"
    )
    assert settings_globals("outbox.example", source) == []


def settings() -> Settings:
    return Settings.load(database_url="postgresql://db.example.com/app")


def test_the_functions_host_reads_its_settings_once_on_first_use() -> None:
    loads: list[Settings] = []

    def load() -> Settings:
        loads.append(settings())
        return loads[-1]

    host = FunctionsHost(load)
    assert loads == []  # nothing at import or construction: the host indexes the app first
    first = host.settings
    assert host.settings is first
    assert loads == [first]


def test_the_functions_host_takes_the_settings_its_runner_built() -> None:
    def load() -> Settings:
        raise ConfigurationError("the environment is not read when settings are handed over")

    host = FunctionsHost(load)
    given = settings()
    host.use(given)
    assert host.settings is given


async def test_closing_the_functions_host_forgets_its_settings() -> None:
    loads: list[Settings] = []

    def load() -> Settings:
        loads.append(settings())
        return loads[-1]

    host = FunctionsHost(load)
    host.use(settings())
    await host.close()
    assert host.settings is loads[0]  # read anew from the environment after a close
    host.stop()  # no relay open: nothing to stop, and no error
