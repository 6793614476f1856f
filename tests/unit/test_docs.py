"""The front page stays a front page, and the documentation stays true to the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from outbox.core.settings import Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_configuration_page_lists_exactly_the_settings() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| `")]
    listed = [re.match(r"\| `([^`]+)`", line)[1] for line in table]  # type: ignore[index]
    assert sorted(listed) == sorted(env_name(field) for field in Settings.model_fields)


def test_the_inbox_sql_for_other_migration_tools_is_the_migration() -> None:
    # Teams on Alembic copy it from docs/consumer.md: it must be what migrate --inbox applies.
    text = (ROOT / "docs" / "consumer.md").read_text()
    [block] = re.findall(r"```sql\n(.*?)```", text, re.DOTALL)
    migrations = sorted((ROOT / "migrations" / "inbox").glob("*.sql"))
    assert block == "".join(path.read_text() for path in migrations)


def test_the_readme_is_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_one_table_says_what_each_answer_does_and_the_guides_link_it() -> None:
    header = "| what happened | row afterwards |"
    tables = [page for page in DOCS for line in page.read_text().splitlines() if line == header]
    assert tables == [ROOT / "README.md"]
    for guide in ("consumer.md", "self-hosting.md"):
        assert "](../README.md#outcomes)" in (ROOT / "docs" / guide).read_text(), guide
    # Only 410 and an endpoint's final_statuses fail a message at once, not any 4xx.
    for page in DOCS:
        text = " ".join(page.read_text().split())
        assert not re.search(r"4xx[^.]*fails? the message", text), page.relative_to(ROOT)
        assert "(a 4xx)" not in text, page.relative_to(ROOT)


def test_every_relative_link_of_the_documentation_leads_somewhere() -> None:
    for page in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target}"


def test_every_anchor_of_the_documentation_names_a_heading() -> None:
    for page in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)]+)\)", page.read_text()):
            linked = page if not target else page.parent / target
            headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
            slugs = {_slug(h) for h in headings}
            assert anchor in slugs, f"{page.relative_to(ROOT)}: {target}#{anchor}"


def test_every_link_from_the_code_to_the_performance_page_names_a_heading() -> None:
    # The fast paths' index (at the top of queries.sql, the store, the relay's parts) points each
    # special case to the section of docs/performance.md that justifies it.
    page = (ROOT / "docs" / "performance.md").read_text()
    slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", page, re.MULTILINE)}
    linked: dict[str, set[str]] = {}
    for path in sorted((ROOT / "outbox").rglob("*")):
        if path.suffix not in (".py", ".sql"):
            continue
        name = path.relative_to(ROOT).as_posix()
        for anchor in re.findall(r"docs/performance\.md#([\w-]+)", path.read_text()):
            assert anchor in slugs, f"{name}: docs/performance.md#{anchor}"
            linked.setdefault(name, set()).add(anchor)
    lean = {"the-leases-batch-size-in-its-sql", "the-lean-outcome-write"}
    assert lean <= linked.get("outbox/store/queries.sql", set())
    assert lean <= linked.get("outbox/store/postgres.py", set())


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_relays_fast_path_notes_name_what_the_performance_page_says() -> None:
    # Each part of the relay notes its performance special cases at its top: § "a heading" of
    # docs/performance.md, and "a phrase" quoted from it.
    page = (ROOT / "docs" / "performance.md").read_text()
    headings = {line.lstrip("#").strip() for line in page.splitlines() if line.startswith("#")}
    flat = " ".join(page.split())
    pointed = []
    for path in sorted((ROOT / "outbox" / "relay").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "docs/performance.md" not in doc:
            continue
        notes = " ".join(doc[doc.index("docs/performance.md") :].split())
        for section, quoted in re.findall(r'(§ )?"([^"]+)"', notes):
            if section:
                assert quoted in headings, (path.name, quoted)
                pointed.append(path.name)
            else:
                assert quoted in flat, (path.name, quoted)
    assert {"lease.py", "batch.py", "dispatch.py", "delivery.py", "record.py"} <= set(pointed)
