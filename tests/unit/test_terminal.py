from __future__ import annotations

import importlib
import logging
import subprocess
import sys

import pytest

from outbox.core.logs import log_event
from outbox.hosting.terminal import ProgressFilter, message_table


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_batches_become_an_occasional_running_total_reset_by_each_run() -> None:
    logger = logging.getLogger("test.console")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    collect = Collect()
    progress = ProgressFilter(every=0.0)
    collect.addFilter(progress)
    logger.addHandler(collect)
    try:
        for _ in range(3):
            log_event(logger, logging.INFO, "outbox.batch", processed=100, retried=2, failed=1)
        log_event(logger, logging.INFO, "outbox.drain", trigger="queue", processed=300)
        log_event(logger, logging.INFO, "outbox.batch", processed=5, retried=0, failed=0)
        progress.every = 3600.0
        log_event(logger, logging.INFO, "outbox.batch", processed=5, retried=0, failed=0)
    finally:
        logger.removeHandler(collect)
    assert collect.lines == [
        "draining: 100 delivered, 2 to retry, 1 failed so far",
        "draining: 200 delivered, 4 to retry, 2 failed so far",
        "draining: 300 delivered, 6 to retry, 3 failed so far",
        "outbox.drain trigger=queue processed=300",
        "draining: 5 delivered, 0 to retry, 0 failed so far",
    ]


@pytest.mark.parametrize("module", ["outbox", "outbox.local", "outbox.demo_receiver"])
def test_help_shows_the_docstring_as_laid_out_without_literal_quotes(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    assert "``" not in done.stdout
    implementation = {"outbox": "outbox.hosting.cli"}.get(module, f"outbox.hosting.{module[7:]}")
    doc = importlib.import_module(implementation).__doc__
    first_line = (doc or "").splitlines()[0].replace("``", "")
    assert first_line in done.stdout


FOREIGN_RECORD = """
import logging, sys
from outbox.hosting import terminal as console
getattr(console, sys.argv[1])()
logging.getLogger("opentelemetry.trace.span").warning(
    "Member doesn't match the w3c identifiers format %s", "congo=t61\\r\\nERROR outbox: FORGED"
)
try:
    raise ValueError("bad\\x1b[2J value")
except ValueError:
    logging.getLogger("asyncio").exception("Task failed\\nERROR outbox: FORGED TOO")
"""


@pytest.mark.parametrize(
    ("configure", "stream"), [("configure_cli", "stderr"), ("configure_console", "stdout")]
)
def test_every_record_the_relays_handlers_write_is_escaped_whoever_logged_it(
    configure: str, stream: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", FOREIGN_RECORD, configure],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = getattr(done, stream).splitlines()
    assert not [line for line in lines if line.startswith("ERROR outbox: FORGED")]
    assert [line for line in lines if "FORGED" in line and "w3c" in line] == [
        lines[0]  # the record on one line, CR LF shown as escapes
    ]
    assert lines[0].endswith("congo=t61\\x0d\\x0aERROR outbox: FORGED")
    assert lines[1].endswith("Task failed\\x0aERROR outbox: FORGED TOO")
    # A traceback keeps its line breaks; the control characters in it are escaped.
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad\\x1b[2J value"


def test_list_says_when_its_search_stopped_short_and_where_to_go_on() -> None:
    shown = message_table([], "2026-01-02T00:00:00Z_x", searched=20_000)
    assert shown.splitlines() == [
        "searched the newest 20,000 rows of this range only",
        "more: --after 2026-01-02T00:00:00Z_x",
    ]
    assert message_table([], None).splitlines() == ["no message matches"]
