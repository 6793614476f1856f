"""The IaC scan's verdict (tests/support/iac_scan.py): what makes `make check` fail."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.iac_scan import problems, template_skips

ROOT = Path(__file__).resolve().parents[2]
REASON = "a reason long enough for a reviewer to read it"


def result(check: str) -> dict[str, str]:
    return {"check_id": check, "check_name": "a check", "resource": "a resource"}


def test_a_failed_check_a_stale_skip_and_a_bare_skip_are_each_reported() -> None:
    skips = {"CKV_A": [REASON], "CKV_B": ["because"], "CKV_C": [REASON]}
    results = {
        "failed_checks": [result("CKV_F")],
        "skipped_checks": [result("CKV_A"), result("CKV_B")],
    }
    found = problems(results, skips)
    assert len(found) == 3
    assert found[0].startswith("CKV_F a check")
    assert "CKV_C: skipped in the template but not a check checkov ran" in found
    assert any(p.startswith("CKV_B: skipped without a reason") for p in found)


def test_a_clean_scan_has_no_problem() -> None:
    results = {"failed_checks": [], "skipped_checks": [result("CKV_A")]}
    assert problems(results, {"CKV_A": [REASON]}) == []


def test_every_skip_in_the_template_gives_a_reason() -> None:
    skips = template_skips(json.loads((ROOT / "infra" / "azuredeploy.json").read_text()))
    assert skips  # the template's own, read as the scan reads them
    assert all(len(reason) >= 30 for reasons in skips.values() for reason in reasons)
