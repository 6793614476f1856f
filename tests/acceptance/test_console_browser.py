"""The operator's console in a real browser: Debian's headless Chromium, driven by Playwright,
against ``python -m outbox serve`` with a real PostgreSQL, Azurite and webhook receivers.

Set ``CONSOLE_SCREENSHOTS`` to a folder to keep screenshots of the overview and of a
message's detail there (docs/images/ holds the ones docs/operations.md shows).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from outbox.core.settings import QueueSettings
from tests.acceptance.test_serve import KEY, serving
from tests.conftest import SECRET
from tests.support.outbox_helpers import eventually, run_cli, seed
from tests.support.receiver import Receiver, Reply

CHROMIUM = "/usr/bin/chromium"
VIEW_KEY = "serve-test-view-key-0123456789"
HOSTILE = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=1</script>'
WAIT_MS = 30_000
# The requeue's batch size set to 2, and every text its progress line shows kept in order.
WATCH_PROGRESS = """() => {
  document.getElementById("requeue-run").dataset.batch = "2";
  const line = document.getElementById("plan-text");
  window.__progress = [];
  new MutationObserver(() => window.__progress.push(line.textContent))
    .observe(line, { childList: true, characterData: true, subtree: true });
}"""


@pytest.fixture
def console_env(
    database_url: str, receiver: Receiver, queue_settings: QueueSettings, tmp_path: Path
) -> dict[str, str]:
    assert queue_settings.queue_connection is not None
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_WEBHOOKS": json.dumps(
            {
                "OrderCompleted": [
                    {"name": "billing", "url": receiver.url("/billing"), "secret": SECRET},
                    {"name": "shipping", "url": receiver.url("/shipping"), "secret": SECRET},
                ],
                "InvoicePaid": {"url": receiver.url("/invoices"), "secret": SECRET},
            }
        ),
        "AzureWebJobsStorage": queue_settings.queue_connection.get_secret_value(),
        "OUTBOX_QUEUE_NAME": queue_settings.queue_name,
        "OUTBOX_FUNCTION_KEY": KEY,
        "OUTBOX_CONSOLE_VIEW_KEY": VIEW_KEY,
        "OUTBOX_MAX_ATTEMPTS": "1",
        "OUTBOX_LOCAL_DIR": str(tmp_path),
    }


@pytest.fixture
async def console(console_env: dict[str, str], tmp_path: Path) -> AsyncIterator[str]:
    """The console's address under a running ``outbox serve``."""
    async with serving(console_env, tmp_path) as (_, api):
        yield f"{api}/console"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox"], headless=True
        )
        yield launched
        await launched.close()


async def open_console(browser: Browser, url: str, key: str) -> tuple[Page, list[str]]:
    """The console in a new tab, given ``key`` once in the fragment; and the dialogs it opens."""
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    dialogs: list[str] = []

    async def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    await page.goto(f"{url}#key={key}")
    await expect(page.locator("#count-Pending b")).to_be_visible(timeout=WAIT_MS)
    return page, dialogs


async def search(page: Page, **filters: str) -> None:
    for name, value in filters.items():
        field = page.locator(f"#filter [name={name}]")
        if name == "status":
            await field.select_option(value)
        else:
            await field.fill(value)
    await page.click("#search")


def rows(page: Page) -> Any:
    return page.locator("#messages tr").filter(has=page.locator("td a.link"))


async def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        await page.screenshot(path=str(Path(folder) / name), full_page=True)


async def test_overview_filter_detail_and_a_planned_requeue_that_the_receiver_gets(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    receiver.script("/invoices", Reply(503), Reply(503), Reply(503))
    await seed(db, 2, "InvoiceVoided")  # no endpoint: fails at once (the hints below drain it)
    for number in range(3):
        await run_cli("enqueue", "InvoicePaid", json.dumps({"invoice": number}), env=console_env)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 5 FROM outbox_messages WHERE status = 'Failed'"),
        timeout=60,
    )
    page, dialogs = await open_console(browser, console, KEY)
    assert "#key" not in page.url  # the key left the address at once
    assert await page.evaluate("sessionStorage.getItem('outboxConsoleKey')") == KEY
    await expect(page.locator("#count-Failed b")).to_have_text("5")
    await expect(page.locator("#count-Pending b")).to_have_text("0")
    await expect(page.locator("#reasons")).to_contain_text("no endpoint configured")
    await screenshot(page, "console-overview.png")

    await search(page, status="Failed", event_type="InvoicePaid")
    await expect(rows(page)).to_have_count(3, timeout=WAIT_MS)
    await rows(page).first.locator("a.link").click()
    attempts = page.locator("#detail-attempts")
    await expect(attempts).to_contain_text("503")
    await expect(attempts).to_contain_text("gave up after 1 attempts: HTTP 503")
    await expect(page.locator("#detail-payload")).to_contain_text('"invoice"')
    await screenshot(page, "console-message.png")

    await page.click("#requeue-plan")
    await expect(page.locator("#plan-text")).to_contain_text("Dry run: 3 Failed message(s)")
    await expect(page.locator("#plan-text")).to_contain_text("InvoicePaid")
    assert len(receiver.to("/invoices")) == 3  # the dry run sent nothing
    # Batches of 2: the progress shows after the first batch, then the second ends the requeue.
    await page.evaluate(WATCH_PROGRESS)
    await page.click("#requeue-run")
    await expect(page.locator("#notice")).to_contain_text("Requeued 3 of 3 message(s)")
    assert await page.evaluate("window.__progress") == ["Requeued 2 of 3…", "Requeued 3 of 3…"]
    await receiver.wait_for(6, path="/invoices", timeout=60)
    voided = await db.fetchval(
        "SELECT count(*) FROM outbox_messages "
        "WHERE status = 'Failed' AND event_type = 'InvoiceVoided'"
    )
    assert voided == 2  # exactly the filtered rows were requeued
    recorded = await db.fetchrow(
        "SELECT affected, result FROM outbox_console_actions WHERE action = 'requeue'"
    )
    progress = json.loads(recorded["result"])
    assert (recorded["affected"], progress["batches"], progress["done"]) == (3, 2, True)
    await expect(page.locator("#actions")).to_contain_text("requeue", timeout=WAIT_MS)
    assert dialogs == []


async def test_pause_holds_one_endpoint_while_the_other_receives_and_resume_delivers(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    page, _ = await open_console(browser, console, KEY)
    await page.select_option(
        "#pause-endpoint", json.dumps(["OrderCompleted", "shipping"], separators=(",", ":"))
    )
    await page.click("#pause-button")
    await expect(page.locator("#paused")).to_contain_text("shipping", timeout=WAIT_MS)
    for number in range(2):
        await run_cli("enqueue", "OrderCompleted", json.dumps({"order": number}), env=console_env)
    await receiver.wait_for(2, path="/billing", timeout=60)
    assert receiver.to("/shipping") == []

    # The receiver answers before the outcome is written: wait for the two attempts' rows.
    async def both_recorded() -> bool:
        return await db.fetchval("SELECT count(*) FROM outbox_attempts") >= 2

    await eventually(both_recorded, timeout=60)
    attempts = await db.fetch("SELECT DISTINCT endpoint FROM outbox_attempts")
    assert [r["endpoint"] for r in attempts] == ["billing"]  # the pause spent no attempt
    await page.click("#resume-button")
    await receiver.wait_for(2, path="/shipping", timeout=60)
    await expect(page.locator("#actions")).to_contain_text("resume", timeout=WAIT_MS)


async def test_a_viewer_key_sees_everything_and_every_action_is_refused(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    await seed(db, 2, "InvoiceVoided")
    await run_cli("drain", env=console_env)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 2 FROM outbox_messages WHERE status = 'Failed'"),
        timeout=60,
    )
    page, _ = await open_console(browser, console, VIEW_KEY)
    await expect(page.locator("#count-Failed b")).to_have_text("2")
    await search(page, status="Failed")
    await expect(rows(page)).to_have_count(2, timeout=WAIT_MS)
    await page.click("#pause-button")
    await expect(page.locator("#notice")).to_contain_text("refused (401)")
    await page.click("#resume-button")
    await expect(page.locator("#notice")).to_contain_text("refused (401)")
    await page.click("#requeue-plan")
    await expect(page.locator("#notice")).to_contain_text("refused (401)")
    assert await db.fetchval("SELECT count(*) FROM outbox_paused_endpoints") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox_messages WHERE status = 'Failed'") == 2


async def test_hostile_payloads_errors_and_event_types_run_nothing(
    db: Any, console: str, browser: Browser
) -> None:
    [message_id] = await seed(db, 1, HOSTILE, payload=lambda i: {"note": HOSTILE})
    await db.execute(
        "UPDATE outbox_messages SET status = 'Failed', last_error = $2 "
        "WHERE outbox_message_id = $1",
        message_id,
        "HTTP 500: " + HOSTILE + " javascript:alert(1)",
    )
    page, dialogs = await open_console(browser, console, KEY)
    await search(page, status="Failed")
    await expect(rows(page)).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#messages")).to_contain_text("<script>window.__pwned=1</script>")
    await rows(page).first.locator("a.link").click()
    await expect(page.locator("#detail-payload")).to_contain_text("onerror")
    await expect(page.locator("#detail-facts")).to_contain_text("javascript:alert(1)")
    await expect(page.locator("#reasons")).to_contain_text("HTTP 500")
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert await page.locator("img").count() == 0
    assert await page.locator("main script").count() == 0
    assert dialogs == []
    response = await page.request.get(console)
    policy = response.headers["content-security-policy"]
    assert "script-src 'nonce-" in policy
    assert "default-src 'none'" in policy


async def test_resend_delivers_a_processed_message_again_with_the_same_webhook_id(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    result = await run_cli("enqueue", "InvoicePaid", '{"invoice": 7}', env=console_env)
    message_id = json.loads(result.stdout)["message_id"]
    await receiver.wait_for(1, path="/invoices", timeout=60)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 1 FROM outbox_messages WHERE status = 'Processed'")
    )
    page, _ = await open_console(browser, console, KEY)
    await search(page, status="Processed")
    await rows(page).first.locator("a.link").click()
    await page.select_option("#resend-endpoint", "InvoicePaid")
    await page.click("#resend-button")
    await expect(page.locator("#notice")).to_contain_text("Resent 1 message(s)")
    await receiver.wait_for(2, path="/invoices", timeout=60)
    first, again = receiver.to("/invoices")
    assert first.webhook_id == again.webhook_id == message_id
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 1 FROM outbox_messages WHERE status = 'Processed'")
    )
    await rows(page).first.locator("a.link").click()
    attempts = page.locator("#detail-attempts tr")
    await expect(attempts).to_have_count(3)  # a heading, the first delivery, the resend
    await expect(attempts.nth(2)).to_contain_text("resend")
    await expect(attempts.nth(1)).not_to_contain_text("resend")
