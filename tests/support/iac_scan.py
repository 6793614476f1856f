"""An IaC scanner over infra/azuredeploy.json: checkov (PyPI), in a venv of its own.

    python -m tests.support.iac_scan        (what `make check` runs)

Passes when checkov finds nothing failed and every skip in the template is one checkov used (no
stale skip) with a reason a reviewer can read (``"metadata": {"checkov": ["skip=ID:reason"]}``).
checkov has many dependencies of its own, so it lives in ``.venv-checkov``, not in the test venv.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "azuredeploy.json"
VENV = ROOT / ".venv-checkov"
CHECKOV = "checkov==3.3.30"
SHORTEST_REASON = 30  # characters: a reason, not a shrug


def ensure_checkov() -> Path:
    executable = VENV / "bin" / "checkov"
    marker = VENV / f".{CHECKOV}"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", CHECKOV], check=True
        )
        marker.touch()
    return executable


def template_skips(template: dict[str, Any]) -> dict[str, list[str]]:
    """Check id → the reasons the template gives for skipping it."""
    skips: dict[str, list[str]] = {}
    for resource in template["resources"]:
        for entry in resource.get("metadata", {}).get("checkov", []):
            check, _, reason = entry.removeprefix("skip=").partition(":")
            skips.setdefault(check, []).append(reason.strip())
    return skips


def problems(results: dict[str, Any], skips: dict[str, list[str]]) -> list[str]:
    found = [
        f"{c['check_id']} {c['check_name']}: {c['resource']}" for c in results["failed_checks"]
    ]
    used = {c["check_id"] for c in results["skipped_checks"]}
    found += [
        f"{check}: skipped in the template but not a check checkov ran"
        for check in sorted(set(skips) - used)
    ]
    found += [
        f"{check}: skipped without a reason a reviewer would read ({reason!r})"
        for check, reasons in skips.items()
        for reason in reasons
        if len(reason) < SHORTEST_REASON
    ]
    return found


def main() -> int:
    checkov = ensure_checkov()
    done = subprocess.run(
        [str(checkov), "--file", str(TEMPLATE), "--framework", "arm", "--output", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    report = json.loads(done.stdout)
    results = report["results"]
    found = problems(results, template_skips(json.loads(TEMPLATE.read_text())))
    summary = report["summary"]
    print(
        f"checkov over {TEMPLATE.relative_to(ROOT)}: {summary['passed']} passed, "
        f"{summary['failed']} failed, {summary['skipped']} skipped with reasons"
    )
    for problem in found:
        print(f"  {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
