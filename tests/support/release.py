"""The release build, as it would be published: ``python -m build`` (an sdist and a wheel, in
isolated build environments) and ``twine check --strict``; then the wheel built from the sdist
alone must be the same wheel, and both must carry what the package needs at run time.

    python -m tests.support.release        (what .ci/run runs)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tests.support.processes import ROOT

# Beside the package: what pyproject.toml, the README and the licence make of a source tree.
SOURCES = ("outbox", "migrations", "pyproject.toml", "README.md", "LICENSE")
# Run-time files a wheel must hold (beside every module).
MUST_HOLD = (
    "outbox/store/queries.sql",
    "outbox/store/partitions/partitions.sql",
    "outbox/operations/queries.sql",
    "outbox/migrations/0001_create_outbox_messages.sql",
    "outbox/migrations/inbox/0001_create_outbox_inbox.sql",
    "outbox/host.json",
    "outbox/py.typed",
    "outbox/azure/assets/console.html",
    "outbox/azure/assets/console.css",
    "outbox/azure/assets/console.js",
)


def build(source: Path, out: Path, *what: str) -> list[Path]:
    before = set(out.glob("*")) if out.exists() else set()
    _run(sys.executable, "-m", "build", *what, "--outdir", str(out), str(source))
    return sorted(set(out.glob("*")) - before)


def copy_sources(target: Path) -> Path:
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, target / name)
    return target


def wheel_files(wheel: Path) -> dict[str, bytes]:
    """Each file of ``wheel`` and its bytes, RECORD left out (it lists the others' hashes)."""
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist() if not n.endswith("/RECORD")}


def problems(folder: Path) -> list[str]:
    found = []
    dist = folder / "dist"
    built = build(copy_sources(folder / "source"), dist)
    [sdist] = [p for p in built if p.name.endswith(".tar.gz")]
    [wheel] = [p for p in built if p.suffix == ".whl"]
    twine = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    if twine.returncode != 0:
        found.append(f"twine check: {twine.stdout}{twine.stderr}")
    with tarfile.open(sdist) as archive:
        archive.extractall(folder / "unpacked", filter="data")
    [unpacked] = (folder / "unpacked").iterdir()
    [again] = build(unpacked, folder / "again", "--wheel")
    direct, from_sdist = wheel_files(wheel), wheel_files(again)
    if direct != from_sdist:
        differ = sorted(set(direct) ^ set(from_sdist)) or sorted(
            n for n in direct if direct[n] != from_sdist[n]
        )
        found.append(f"the sdist builds another wheel: {differ[:10]}")
    found += [f"the wheel lacks {name}" for name in MUST_HOLD if name not in direct]
    migrations = [f"outbox/{p.relative_to(ROOT)}" for p in (ROOT / "migrations").rglob("*.sql")]
    found += [f"the wheel lacks {name}" for name in migrations if name not in direct]
    metadata = next(v for n, v in direct.items() if n.endswith(".dist-info/METADATA")).decode()
    for field in (
        "License-Expression: MIT",
        "Requires-Python: <3.14,>=3.11",
        "Classifier: ",
        "Provides-Extra: azure",
    ):
        if field not in metadata:
            found.append(f"the metadata lacks {field!r}")
    if not any(n.endswith("licenses/LICENSE") for n in direct):
        found.append("the wheel carries no LICENSE")
    return found


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])}… failed:\n{done.stdout}\n{done.stderr}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="outbox-release-") as scratch:
        found = problems(Path(scratch))
    for problem in found:
        print(f"release build: {problem}", file=sys.stderr)
    if not found:
        print("release build: sdist and wheel built, twine check passed, and the sdist alone")
        print("  builds the same wheel, with the package's SQL, migrations and licence")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
