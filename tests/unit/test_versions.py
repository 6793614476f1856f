"""The version in pyproject.toml has its changelog entry, in Keep a Changelog's form."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$", re.M)


def entries() -> list[tuple[str, str | None]]:
    return [(m["version"], m["date"]) for m in HEADING.finditer(CHANGELOG)]


def test_the_packages_version_has_a_dated_changelog_entry() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    released = dict(entries())
    assert version in released, f"CHANGELOG.md has no entry for {version}"
    assert released[version] is not None, f"{version}'s entry has no date"


def test_the_entries_go_newest_first_with_unreleased_on_top() -> None:
    found = entries()
    assert found[0] == ("Unreleased", None) or found[0][1] is not None
    versions = [Version(v) for v, _ in found if v != "Unreleased"]
    assert versions == sorted(versions, reverse=True)
    dates = [d for _, d in found if d is not None]
    assert dates == sorted(dates, reverse=True)


def test_each_entry_uses_keep_a_changelogs_sections_only() -> None:
    sections = set(re.findall(r"^### (.+)$", CHANGELOG, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_licence_file_is_the_one_the_metadata_declares() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_the_telemetry_scope_names_the_packages_version() -> None:
    from outbox.core.telemetry import VERSION

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == VERSION
