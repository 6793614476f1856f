"""The package a producing service installs: built from this folder as pip builds it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_the_package_and_its_statements_and_imports_on_its_own(
    tmp_path: Path,
) -> None:
    # From a copy: a build writes into its source folder.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT / "outbox", source / "outbox", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "requirements.txt", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    [wheel] = (tmp_path / "dist").glob("outbox_relay-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "outbox/sql/queries.sql" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "function_app"))]
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))
    )
    assert b"Requires-Dist: asyncpg" in metadata
    # Installed elsewhere, away from this checkout, it imports and finds its SQL.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    probe = (
        "import outbox, outbox.store; "
        "print(outbox.__file__); print(callable(outbox.enqueue)); "
        "print('lease_batch' in outbox.store.QUERIES)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    where, importable, statements = done.stdout.split()
    assert where.startswith(str(site))
    assert (importable, statements) == ("True", "True")
