"""The package's layers, kept by their imports: each subpackage imports only the layers below it.

core ← store, transport ← relay, producer, operations ← azure ← hosting. The relay, the producer
and the operations never import one another; nothing imports the top-level modules that keep the
documented paths.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "outbox"

# What each layer may import besides itself.
ALLOWED = {
    "core": set(),
    "store": {"core"},
    "transport": {"core"},
    "relay": {"core", "store", "transport"},
    "producer": {"core", "store", "transport"},
    "operations": {"core", "store", "transport"},
    "azure": {"core", "store", "transport", "relay", "operations"},
    "hosting": {"core", "store", "transport", "relay", "producer", "operations", "azure"},
}
# The package's own modules outside the layers: its exports, `python -m outbox`, and the
# documented paths that re-export a layer's module.
TOP_LEVEL = {
    "outbox",
    "outbox.__main__",
    "outbox.functions",
    "outbox.sync",
    "outbox.inbox",
    "outbox.telemetry",
    "outbox.errors",
    "outbox.local",
    "outbox.demo_receiver",
    "outbox.entra",
    "outbox.testing",
    "outbox.pytest_plugin",
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def imported(module: str, is_package: bool, source: str) -> list[tuple[int, str]]:
    """The package's modules that ``source`` (the text of ``module``) imports, with their lines:
    absolute and relative imports alike, wherever they stand (in functions, under TYPE_CHECKING)."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [base])])
            # `from outbox import store` names a module; `from outbox.store import QUERIES` not.
            if base in ("outbox", *(f"outbox.{layer}" for layer in ALLOWED)):
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return [(line, name) for line, name in found if name.split(".")[0] == "outbox"]


def broken_rules(module: str, is_package: bool, source: str) -> list[str]:
    """Each import of ``module`` that runs against its layer's direction, said in one line."""
    layer = layer_of(module)
    assert layer is not None, module
    broken = []
    for line, name in imported(module, is_package, source):
        parts = name.split(".")
        target = parts[1] if len(parts) > 1 else "outbox"
        if target == layer:
            continue
        if target not in ALLOWED:
            broken.append(f"{module}:{line} imports {name}: a layer imports layers, not {name}")
        elif target not in ALLOWED[layer]:
            broken.append(f"{module}:{line} imports {name}: {layer} never imports {target}")
    return broken


def modules() -> list[tuple[str, bool, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        found.append((".".join(parts[:-1] if is_package else parts), is_package, path))
    return found


def test_every_module_of_the_package_belongs_to_a_layer_or_keeps_a_documented_path() -> None:
    stray = [m for m, _, _ in modules() if layer_of(m) is None and m not in TOP_LEVEL]
    assert stray == []


def test_no_layer_imports_upwards() -> None:
    broken = [
        rule
        for module, is_package, path in modules()
        if layer_of(module)
        for rule in broken_rules(module, is_package, path.read_text(encoding="utf-8"))
    ]
    assert broken == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("outbox.relay.processor", "from outbox.hosting import serve"),
        ("outbox.relay.processor", "from ..azure.triggers import on_hint"),
        ("outbox.relay.processor", "def f():\n    import outbox.hosting.cli"),
        ("outbox.relay.processor", "from outbox import telemetry"),  # the top-level path
        ("outbox.producer.core", "from outbox.relay import processor"),
        ("outbox.core.models", "from outbox import store"),
        ("outbox.store.postgres", "from outbox.transport.wakeup import WakeUpQueue"),
        ("outbox.store.schema", "from outbox.operations import status"),
        ("outbox.relay.wakeups", "from outbox.operations.status import backlog_status"),
        ("outbox.operations.views", "from outbox.relay.batch import endpoint_names"),
        ("outbox.operations.actions", "from outbox.azure.host import functions_host"),
        ("outbox.azure.triggers", "from outbox.hosting.serve import serve"),
    ],
)
def test_an_import_against_the_direction_is_caught(module: str, source: str) -> None:
    [broken] = broken_rules(module, False, source)
    assert broken.startswith(f"{module}:")


def test_imports_along_the_direction_pass() -> None:
    source = (
        "from outbox import store\nfrom outbox.core.models import Status\nfrom . import admission"
    )
    assert broken_rules("outbox.relay.processor", False, source) == []
    assert broken_rules("outbox.store", True, "from outbox.store.sql import QUERIES") == []
    assert (
        broken_rules("outbox.operations.status", False, "from outbox.store import partitions") == []
    )
    assert broken_rules("outbox.azure.console", False, "from outbox.operations import views") == []


@pytest.mark.parametrize(
    ("public", "module", "names"),
    [
        ("outbox.functions", "outbox.azure.functions", ["bp"]),
        ("outbox.sync", "outbox.producer.sync", None),
        ("outbox.inbox", "outbox.producer.inbox", None),
        ("outbox.telemetry", "outbox.azure.telemetry_setup", ["configure"]),
        ("outbox.errors", "outbox.core.errors", ["OutboxError", "InvalidSignature"]),
        ("outbox.local", "outbox.hosting.local", ["main"]),
        ("outbox.demo_receiver", "outbox.hosting.demo_receiver", ["main"]),
    ],
)
def test_the_documented_paths_give_the_moved_modules_own_objects(
    public: str, module: str, names: list[str] | None
) -> None:
    shown, actual = importlib.import_module(public), importlib.import_module(module)
    for name in names or actual.__all__:
        assert getattr(shown, name) is getattr(actual, name), name


def test_loggers_keep_their_names_whatever_module_holds_them() -> None:
    # Users filter on the names (outbox.processor, outbox.migrate, ...): never the module's path.
    named = [
        path.relative_to(PACKAGE.parent).as_posix()
        for _, _, path in modules()
        if "getLogger(__name__)" in path.read_text(encoding="utf-8")
    ]
    assert named == []


def test_the_relay_reaches_the_database_only_through_its_store_contract() -> None:
    # Every part of the relay takes a RelayStore (store/contract.py), so the loop runs over
    # MemoryStore as over PostgreSQL; only the runtime opens the pool and builds the
    # PostgresStore over it (and the processor wraps a pool given in a store's place).
    from outbox.store.contract import RelayStore

    builders = {"outbox.relay.runtime", "outbox.relay.processor"}
    contract = {name for name in vars(RelayStore) if not name.startswith("_")}
    direct = []
    for module, is_package, path in modules():
        if layer_of(module) != "relay":
            continue
        for line, name in imported(module, is_package, path.read_text(encoding="utf-8")):
            allowed = {"outbox.store.contract"}
            if module in builders:
                allowed |= {"outbox.store.postgres", "outbox.store.connection"}
            if name.startswith("outbox.store") and name not in allowed:
                direct.append(f"{module}:{line} imports {name}")
    assert direct == []
    assert contract >= {"lease_batch", "record_outcomes", "record_delivered", "endpoint_failed"}
