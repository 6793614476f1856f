"""docs/reliability.md stays true: its table names real tests, covers this directory, and says
``pass`` only because the suite that would otherwise fail includes every test it names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
COLUMNS = ["Scenario", "What is injected", "What the tests assert", "Tests", "Result"]
NODE_ID = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def table_rows() -> list[dict[str, str]]:
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    header, separator, *body = (_cells(line) for line in lines)
    assert header == COLUMNS
    assert all(set(cell) <= set("-:") for cell in separator)
    rows = [dict(zip(header, cells, strict=True)) for cells in body]
    assert rows, "the table has no rows"
    return rows


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def defined_tests(path: Path) -> set[str]:
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, functions) and n.name.startswith("test_")}


def test_the_table_names_only_existing_tests_and_every_reliability_test() -> None:
    named: set[tuple[str, str | None]] = set()
    for row in table_rows():
        assert row["Result"] == "pass", row["Scenario"]
        references = NODE_ID.findall(row["Tests"])
        assert references, f"{row['Scenario']}: no tests named"
        for path, function in references:
            assert (ROOT / path).is_file(), f"{row['Scenario']}: {path} does not exist"
            if function:
                assert function in defined_tests(ROOT / path), (
                    f"{row['Scenario']}: {path}::{function} does not exist"
                )
            named.add((path, function or None))
    for path in sorted((ROOT / "tests" / "reliability").glob("test_*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for function in sorted(defined_tests(path)):
            assert (relative, function) in named, f"{relative}::{function} has no row"
