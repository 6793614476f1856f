"""The operator's console in a real browser: Debian's headless Chromium, driven by Playwright,
against ``python -m outbox serve`` with a real PostgreSQL, Azurite and webhook receivers.

Set ``CONSOLE_SCREENSHOTS`` to a folder to keep screenshots of the overview, of a message's page
and of the endpoints there (docs/images/ holds the ones docs/operations.md shows).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

import outbox
from outbox.core.settings import QueueSettings
from tests.acceptance.test_serve import KEY, serving
from tests.conftest import SECRET
from tests.support.azure import free_port
from tests.support.outbox_helpers import eventually, run_cli, seed
from tests.support.receiver import Receiver, Reply

CHROMIUM = "/usr/bin/chromium"
VIEW_KEY = "serve-test-view-key-0123456789"
HOSTILE = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=1</script>'
WAIT_MS = 30_000
DURATION = re.compile(r"^\d+ ms$|^\d+\.\d+ s$")
# The requeue's batch size set to 2, and every text its progress line shows kept in order.
WATCH_PROGRESS = """() => {
  document.getElementById("plan").dataset.batch = "2";
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
                # Nothing listens there: each attempt ends in a connection error.
                "ParcelLost": {"url": f"http://127.0.0.1:{free_port()}/", "secret": SECRET},
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


async def new_tab(browser: Browser) -> tuple[Page, list[str]]:
    """A new tab, and the browser's own dialogs it opens (alert, confirm: there must be none)."""
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    dialogs: list[str] = []

    async def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    return page, dialogs


async def open_console(browser: Browser, url: str, key: str) -> tuple[Page, list[str]]:
    """The console in a new tab, given ``key`` once in the fragment; and the dialogs it opens."""
    page, dialogs = await new_tab(browser)
    await page.goto(f"{url}#key={key}")
    await expect(page.locator("#count-Pending b")).to_be_visible(timeout=WAIT_MS)
    return page, dialogs


async def view(page: Page, name: str) -> None:
    await page.click(f"nav [data-view={name}]")


async def search(page: Page, **filters: str) -> None:
    await view(page, "messages")
    for name, value in filters.items():
        field = page.locator(f"#filter [name={name}]")
        if name == "status":
            await field.select_option(value)
        else:
            await field.fill(value)
    await page.click("#search")


async def look_up(page: Page, message_id: object) -> None:
    await page.fill("#lookup-id", str(message_id))
    await page.click("#lookup-open")


async def confirm(page: Page, *phrases: str, reason: str | None = None) -> None:
    """The confirmation names what will happen: check it, then confirm."""
    dialog = page.locator("#confirm")
    await expect(dialog).to_be_visible()
    for phrase in phrases:
        await expect(dialog).to_contain_text(phrase)
    if reason is not None:
        await page.fill("#confirm-reason", reason)
    await page.click("#confirm-ok")
    await expect(dialog).to_be_hidden()


def rows(page: Page) -> Any:
    return page.locator("#messages tr").filter(has=page.locator("td a.link"))


def action_buttons(page: Page) -> Any:
    """The buttons that would change something, as far as an operator can see them."""
    return page.locator("button:visible").filter(
        has_text=re.compile(r"Requeue|Resend|Cancel…|Pause|Resume|Probe|Replay")
    )


async def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("CONSOLE_SCREENSHOTS")
    if folder:
        await page.screenshot(path=str(Path(folder) / name), full_page=True)


async def failed_invoice(db: Any, receiver: Receiver, console_env: dict[str, str]) -> str:
    """An InvoicePaid message that the receiver refused (503, one attempt allowed): Failed."""
    receiver.script("/invoices", Reply(503, b"invoices are down for maintenance"))
    result = await run_cli("enqueue", "InvoicePaid", '{"invoice": 7}', env=console_env)
    message_id: str = json.loads(result.stdout)["message_id"]
    await eventually(
        lambda: db.fetchval(
            "SELECT status = 'Failed' FROM outbox_messages WHERE outbox_message_id = $1",
            UUID(message_id),
        ),
        timeout=60,
    )
    return message_id


async def test_health_banner_says_unhealthy_and_why_then_healthy_once_fixed(
    db: Any, console: str, browser: Browser
) -> None:
    # A message nobody has published for 17 hours: the same rule as status says unhealthy.
    stuck = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, created_at, "
        "next_attempt_at) VALUES (gen_random_uuid(), 'InvoicePaid', '{}', "
        "now() - interval '17 hours', now() + interval '1 day') RETURNING outbox_message_id"
    )
    page, _ = await open_console(browser, console, KEY)
    banner = page.locator("#health")
    await expect(page.locator("#health-state")).to_have_text("Unhealthy")
    await expect(banner).to_have_class("health unhealthy")
    await expect(page.locator("#health-why")).to_contain_text("oldest unpublished message is")
    await expect(page.locator("#health-age")).to_contain_text("oldest unpublished message 17 h old")
    # The banner comes first, above everything the page shows.
    top = await banner.bounding_box()
    counts = await page.locator("#counts").bounding_box()
    assert top is not None
    assert counts is not None
    assert top["y"] < counts["y"]

    await db.execute("DELETE FROM outbox_messages WHERE outbox_message_id = $1", stuck)
    await page.click("#refresh")
    await expect(page.locator("#health-state")).to_have_text("Healthy")
    await expect(banner).to_have_class("health healthy")
    await expect(page.locator("#health-why")).to_have_text("")
    await expect(page.locator("#health-age")).to_contain_text("nothing unpublished")


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
    await expect(page.locator("#detail-facts")).to_contain_text(
        "gave up after 1 attempts: HTTP 503"
    )
    await expect(page.locator("#detail-payload")).to_contain_text('"invoice"')
    await screenshot(page, "console-message.png")

    # Cancelling the confirmation does nothing.
    await search(page, status="Failed", event_type="InvoicePaid")
    await page.click("#requeue-plan")
    await expect(page.locator("#confirm")).to_contain_text("Requeue 3 Failed messages")
    await page.click("#confirm-cancel")
    await expect(page.locator("#confirm")).to_be_hidden()
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 0
    assert len(receiver.to("/invoices")) == 3  # neither the dry run nor the cancel sent anything

    # Batches of 2: the progress shows after the first batch, then the second ends the requeue.
    await page.evaluate(WATCH_PROGRESS)
    await page.click("#requeue-plan")
    await confirm(page, "Requeue 3 Failed messages", "event type InvoicePaid", "InvoicePaid")
    await expect(page.locator("#notice")).to_contain_text("Requeued 3 of 3 message(s)")
    assert await page.evaluate("window.__progress") == [
        "Requeuing 3 messages…",
        "Requeued 2 of 3…",
        "Requeued 3 of 3…",
    ]
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
    await view(page, "audit")
    await expect(page.locator("#actions")).to_contain_text("requeue", timeout=WAIT_MS)
    assert dialogs == []


async def test_lookup_by_id_opens_the_message_and_its_error_goes_with_the_next_success(
    db: Any, console: str, browser: Browser
) -> None:
    [message_id] = await seed(db, 1, "InvoiceVoided", payload=lambda i: {"lookup": "me"})
    page, _ = await open_console(browser, console, KEY)
    unknown = "0190c5e1-0000-7000-8000-000000000000"
    await look_up(page, unknown)
    notice = page.locator("#notice")
    await expect(notice).to_contain_text(unknown)
    await expect(notice).to_have_class("notice bad")
    await expect(page.locator("#view-overview")).to_be_visible()  # where it was

    await look_up(page, f"  {message_id}  ")
    await expect(page.locator("#detail-id")).to_have_text(str(message_id))
    await expect(page.locator("#detail-payload")).to_contain_text('"lookup": "me"')
    # Times in one zone, to the minute, with how long ago ("now" within a second).
    created = page.locator("#detail-facts tr", has_text="created").locator("td").nth(1)
    minute_and_age = r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC \((?:[\w ]+ ago|now)\)$"
    await expect(created).to_have_text(re.compile(minute_and_age))
    await expect(notice).to_be_hidden()  # the stale error went with the success
    await expect(page.locator("#notice-text")).to_have_text("")


async def test_an_error_then_a_success_leaves_no_error_shown(
    console: str, browser: Browser
) -> None:
    page, _ = await new_tab(browser)
    await page.goto(f"{console}#key=not-the-key-0123456789")
    await expect(page.locator("#notice")).to_contain_text("refused (401)")
    await expect(page.locator("#health-state")).to_contain_text("Health unknown")
    await page.fill("#key-input", KEY)
    await page.click("#key-form button")
    await expect(page.locator("#health-state")).to_have_text("Healthy")
    await expect(page.locator("#notice")).to_be_hidden()
    await expect(page.locator("#notice-text")).to_have_text("")


async def test_a_failed_message_is_requeued_from_its_page_after_a_confirmation(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    message_id = await failed_invoice(db, receiver, console_env)
    page, dialogs = await open_console(browser, console, KEY)
    await look_up(page, message_id)
    await expect(page.locator("#detail-facts")).to_contain_text("Failed")
    requeue = page.locator("#detail-actions button", has_text="Requeue…")
    # The actions a Failed message allows, and only those.
    await expect(page.locator("#detail-actions button")).to_have_count(1)

    await requeue.click()
    await expect(page.locator("#confirm")).to_contain_text("Requeue 1 Failed message")
    await expect(page.locator("#confirm")).to_contain_text(message_id)
    await page.click("#confirm-cancel")
    await expect(page.locator("#confirm")).to_be_hidden()
    assert await db.fetchval("SELECT count(*) FROM outbox_console_actions") == 0
    assert len(receiver.to("/invoices")) == 1

    await requeue.click()
    await confirm(page, "Requeue 1 Failed message", message_id, "InvoicePaid")
    await expect(page.locator("#notice")).to_contain_text(f"Requeued 1 message: {message_id}")
    await receiver.wait_for(2, path="/invoices", timeout=60)
    # The page refreshes itself: the message is delivered, and its actions follow its status.
    await expect(page.locator("#detail-facts")).to_contain_text("Processed", timeout=WAIT_MS)
    await expect(page.locator("#detail-actions button")).to_have_text(["Resend…"])
    assert (
        await db.fetchval("SELECT count(*) FROM outbox_console_actions WHERE action = 'requeue'")
        == 1
    )
    assert dialogs == []


async def test_resend_to_one_endpoint_of_several_after_a_confirmation(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    result = await run_cli("enqueue", "OrderCompleted", '{"order": 7}', env=console_env)
    message_id = json.loads(result.stdout)["message_id"]
    await receiver.wait_for(1, path="/shipping", timeout=60)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 1 FROM outbox_messages WHERE status = 'Processed'")
    )
    page, _ = await open_console(browser, console, KEY)
    await search(page, status="Processed")
    await rows(page).first.locator("a.link").click()
    await expect(page.locator("#detail-actions button")).to_have_text(
        ["Resend to every endpoint…", "Resend to billing…", "Resend to shipping…"]
    )
    await page.click("#detail-actions button:has-text('Resend to shipping…')")
    await confirm(page, "Send 1 Processed message", message_id, "again to shipping")
    await expect(page.locator("#notice")).to_contain_text("Resent 1 message to shipping")
    await receiver.wait_for(2, path="/shipping", timeout=60)
    first, again = receiver.to("/shipping")
    assert first.webhook_id == again.webhook_id == message_id
    assert len(receiver.to("/billing")) == 1
    attempts = page.locator("#detail-attempts tr")
    # A heading, the first two deliveries, the resend (the page refreshes itself).
    await expect(attempts).to_have_count(4, timeout=WAIT_MS)
    await expect(attempts.nth(3)).to_contain_text("resend")
    await expect(attempts.nth(1)).not_to_contain_text("resend")


async def test_a_pending_message_is_cancelled_with_a_reason_after_a_confirmation(
    db: Any, console: str, browser: Browser
) -> None:
    waiting = await db.fetchval(
        "INSERT INTO outbox_messages (outbox_message_id, event_type, payload, next_attempt_at) "
        "VALUES (gen_random_uuid(), 'InvoicePaid', '{}', now() + interval '1 day') "
        "RETURNING outbox_message_id"
    )
    page, _ = await open_console(browser, console, KEY)
    await look_up(page, waiting)
    await expect(page.locator("#detail-facts")).to_contain_text("Pending")
    await expect(page.locator("#detail-actions button")).to_have_text(["Cancel…"])
    await page.click("#detail-actions button")
    await expect(page.locator("#confirm")).to_contain_text("Cancel 1 Pending message")
    await page.click("#confirm-ok")  # no reason given: the dialog stays and says why
    await expect(page.locator("#confirm-problem")).to_contain_text("Give a reason")
    await expect(page.locator("#confirm")).to_be_visible()
    assert await db.fetchval("SELECT count(*) FROM outbox_messages WHERE status = 'Failed'") == 0
    await page.fill("#confirm-reason", HOSTILE)
    await page.click("#confirm-ok")
    await expect(page.locator("#notice")).to_contain_text("Cancelled 1 message")
    await expect(page.locator("#detail-facts")).to_contain_text("Failed")
    await expect(page.locator("#detail-facts")).to_contain_text(
        f"cancelled by function key: {HOSTILE}"
    )
    await expect(page.locator("#detail-actions button")).to_have_text(["Requeue…"])
    assert await page.evaluate("typeof window.__pwned") == "undefined"


async def test_several_chosen_messages_are_resent_at_once_and_the_list_refreshes_itself(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    refused = await failed_invoice(db, receiver, console_env)
    delivered = []
    for number in range(3):
        result = await run_cli("enqueue", "InvoicePaid", json.dumps({"n": number}), env=console_env)
        delivered.append(json.loads(result.stdout)["message_id"])
    await receiver.wait_for(4, path="/invoices", timeout=60)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 3 FROM outbox_messages WHERE status = 'Processed'")
    )
    page, _ = await open_console(browser, console, KEY)
    await search(page, event_type="InvoicePaid")
    await expect(rows(page)).to_have_count(4)
    for box in await page.locator("#messages input[type=checkbox]").all():
        await box.check()
    await expect(page.locator("#selected-count")).to_have_text("4 messages chosen")
    await page.click("#resend-chosen")
    # The dry run's plan: the three delivered ones, and which chosen one is left, and why.
    await confirm(
        page, "Send 3 Processed messages again", "1 chosen message left as it is", refused
    )
    await expect(page.locator("#notice")).to_contain_text("Resent 3 messages")
    await receiver.wait_for(7, path="/invoices", timeout=60)
    assert sorted(r.webhook_id for r in receiver.to("/invoices")[4:]) == sorted(delivered)

    # A message enqueued meanwhile appears in the list without a click.
    await run_cli("enqueue", "InvoicePaid", '{"n": 9}', env=console_env)
    await expect(rows(page)).to_have_count(5, timeout=WAIT_MS)


async def test_a_failed_attempt_shows_its_own_outcome_error_class_response_and_duration(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    refused = await failed_invoice(db, receiver, console_env)
    await run_cli("requeue", "--id", refused, env=console_env)  # then delivered
    await receiver.wait_for(2, path="/invoices", timeout=60)
    result = await run_cli("enqueue", "ParcelLost", '{"parcel": 1}', env=console_env)
    unreachable = json.loads(result.stdout)["message_id"]
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) = 2 FROM outbox_messages WHERE status IN ('Processed', 'Failed')"
        ),
        timeout=60,
    )
    page, _ = await open_console(browser, console, KEY)
    await look_up(page, refused)
    attempts = page.locator("#detail-attempts tr")
    await expect(attempts).to_have_count(3)
    await expect(page.locator("#detail-facts")).to_contain_text("Processed")
    refusal = attempts.nth(1)
    await expect(refusal).to_contain_text("503")
    await expect(refusal).to_contain_text("invoices are down for maintenance")
    await expect(refusal.locator("td").nth(4)).to_have_text(DURATION)
    # The attempt's own outcome, not the message's status now.
    await expect(refusal.locator("td").nth(2)).not_to_have_text("Processed")
    await expect(attempts.nth(2).locator("td").nth(2)).to_have_text("Processed")

    await look_up(page, unreachable)
    attempt = page.locator("#detail-attempts tr").nth(1)
    await expect(attempt.locator("td").nth(6)).to_have_text(re.compile(r"^\w+Error$"))
    await expect(attempt.locator("td").nth(4)).to_have_text(DURATION)
    await expect(attempt.locator("td").nth(2)).to_have_text("Failed")


async def test_a_held_message_shows_what_holds_it_instead_of_a_date(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    receiver.script("/invoices", Reply(503))
    async with db.transaction():
        first = await outbox.enqueue(db, "InvoicePaid", {"n": 1}, ordering_key="customer-7")
        held = await outbox.enqueue(db, "InvoicePaid", {"n": 2}, ordering_key="customer-7")
    await run_cli("drain", env=console_env)
    await eventually(
        lambda: db.fetchval(
            "SELECT status = 'Failed' FROM outbox_messages WHERE outbox_message_id = $1", first
        ),
        timeout=60,
    )
    page, _ = await open_console(browser, console, KEY)
    await look_up(page, held)
    facts = page.locator("#detail-facts")
    await expect(facts).to_contain_text(f"held behind {first}")
    await expect(facts).not_to_contain_text("9999")
    await facts.locator("a.link", has_text=str(first)).click()
    await expect(page.locator("#detail-id")).to_have_text(str(first))


async def test_the_whole_payload_downloads_beyond_100000_characters(
    db: Any, console: str, browser: Browser
) -> None:
    big = "x" * 150_000
    [message_id] = await seed(db, 1, "InvoiceVoided", payload=lambda i: {"blob": big})
    page, _ = await open_console(browser, console, KEY)
    await look_up(page, message_id)
    await expect(page.locator("#payload-note")).to_contain_text("the first 100,000 characters")
    async with page.expect_download() as downloading:
        await page.click("#download")
    download = await downloading.value
    assert download.suggested_filename == f"{message_id}.json"
    saved = await download.path()
    assert json.loads(Path(saved).read_text(encoding="utf-8")) == {"blob": big}


async def test_forget_key_leaves_no_data_on_the_page(
    db: Any, console: str, browser: Browser
) -> None:
    [message_id] = await seed(db, 1, "InvoiceVoided", payload=lambda i: {"secret": "s3cr3t"})
    page, _ = await open_console(browser, console, KEY)
    await look_up(page, message_id)
    await expect(page.locator("#detail-payload")).to_contain_text("s3cr3t")
    await page.click("#forget")
    await expect(page.locator("#notice")).to_contain_text("Key forgotten")
    await expect(page.locator("#health-state")).to_have_text("No key given")
    assert await page.evaluate("sessionStorage.getItem('outboxConsoleKey')") is None
    html = await page.content()
    for datum in (str(message_id), "s3cr3t", "InvoiceVoided", "InvoicePaid", "billing"):
        assert datum not in html
    assert await page.locator("td").count() == 0
    await page.click("#refresh")  # with no key, nothing comes back
    await expect(page.locator("#health-state")).to_have_text("No key given")
    assert await page.locator("td").count() == 0


async def test_a_viewer_sees_everything_and_no_action(
    db: Any, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    await seed(db, 2, "InvoiceVoided")
    await run_cli("drain", env=console_env)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 2 FROM outbox_messages WHERE status = 'Failed'"),
        timeout=60,
    )
    page, _ = await open_console(browser, console, VIEW_KEY)
    await expect(page.locator("#who")).to_contain_text("read only")
    await expect(page.locator("#count-Failed b")).to_have_text("2")
    await search(page, status="Failed")
    await expect(rows(page)).to_have_count(2, timeout=WAIT_MS)
    await expect(action_buttons(page)).to_have_count(0)
    await rows(page).first.locator("a.link").click()
    await expect(page.locator("#detail-facts")).to_contain_text("Failed")
    await expect(page.locator("#detail-actions button")).to_have_count(0)
    await expect(action_buttons(page)).to_have_count(0)
    await expect(page.locator("nav [data-view=replay]")).to_be_hidden()
    await view(page, "endpoints")
    await expect(page.locator("#endpoints")).to_contain_text("shipping")
    await expect(action_buttons(page)).to_have_count(0)


async def test_a_key_in_code_is_ignored_and_one_in_the_fragment_is_taken(
    console: str, browser: Browser
) -> None:
    page, _ = await new_tab(browser)
    await page.goto(f"{console}?code={KEY}")
    await expect(page.locator("#notice")).to_contain_text("is not used")
    await expect(page.locator("#health-state")).to_have_text("No key given")
    assert "code" not in page.url
    assert await page.evaluate("sessionStorage.getItem('outboxConsoleKey')") is None
    assert await page.locator("#count-Pending").count() == 0

    # A key typed as #key=… into the open tab is taken, and leaves the address.
    await page.evaluate(f"location.hash = '#key={KEY}'")
    await expect(page.locator("#count-Pending b")).to_have_text("0", timeout=WAIT_MS)
    await expect(page.locator("#notice")).to_be_hidden()
    assert "#key" not in page.url
    assert await page.evaluate("sessionStorage.getItem('outboxConsoleKey')") == KEY


async def test_endpoints_page_pauses_resumes_and_probes_after_confirmation(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    page, _ = await open_console(browser, console, KEY)
    await view(page, "endpoints")
    table = page.locator("#endpoints")
    shipping = table.locator("tr", has_text="shipping")
    await expect(shipping).to_contain_text("healthy", timeout=WAIT_MS)
    await shipping.locator("button", has_text="Pause…").click()
    await page.click("#confirm-cancel")  # cancelled: nothing paused
    assert await db.fetchval("SELECT count(*) FROM outbox_paused_endpoints") == 0
    await shipping.locator("button", has_text="Pause…").click()
    await confirm(page, "Pause shipping", "OrderCompleted")
    await expect(shipping).to_contain_text("paused")
    await expect(shipping).to_contain_text("function key")  # paused by whom
    for number in range(2):
        await run_cli("enqueue", "OrderCompleted", json.dumps({"order": number}), env=console_env)
    await receiver.wait_for(2, path="/billing", timeout=60)
    assert receiver.to("/shipping") == []
    await shipping.locator("button", has_text="Resume…").click()
    await confirm(page, "Resume shipping")
    await receiver.wait_for(2, path="/shipping", timeout=60)

    # An open breaker with a message waiting: "Probe now" sends it at once, and the breaker
    # closes on the success.
    await db.execute(
        "INSERT INTO outbox_endpoints (event_type, endpoint, consecutive_failures, opens, "
        "opened_at, reopen_at) VALUES ('InvoicePaid', 'InvoicePaid', 5, 1, "
        "now() - interval '1 minute', now() + interval '1 hour')"
    )
    await run_cli("enqueue", "InvoicePaid", '{"invoice": 1}', env=console_env)
    invoices = table.locator("tr", has_text="InvoicePaid")
    await page.click("#refresh")
    await expect(invoices).to_contain_text("breaker open", timeout=WAIT_MS)
    await screenshot(page, "console-endpoints.png")
    assert receiver.to("/invoices") == []
    await invoices.locator("button", has_text="Probe now…").click()
    await confirm(page, "Probe InvoicePaid of InvoicePaid")
    await expect(page.locator("#notice")).to_contain_text("due now")
    await receiver.wait_for(1, path="/invoices", timeout=60)
    await expect(invoices).to_contain_text("healthy", timeout=WAIT_MS)
    actions = await db.fetch("SELECT action FROM outbox_console_actions ORDER BY created_at")
    assert [a["action"] for a in actions] == ["pause", "resume", "probe"]


async def test_replay_a_window_dry_run_then_confirm_then_result(
    db: Any, receiver: Receiver, console: str, console_env: dict[str, str], browser: Browser
) -> None:
    ids = []
    for number in range(3):
        result = await run_cli("enqueue", "InvoicePaid", json.dumps({"n": number}), env=console_env)
        ids.append(json.loads(result.stdout)["message_id"])
    await receiver.wait_for(3, path="/invoices", timeout=60)
    await eventually(
        lambda: db.fetchval("SELECT count(*) = 3 FROM outbox_messages WHERE status = 'Processed'")
    )
    window = await db.fetchrow(
        "SELECT min(created_at) - interval '1 second' AS start, "
        "max(created_at) + interval '1 second' AS stop FROM outbox_messages"
    )
    page, _ = await open_console(browser, console, KEY)
    await view(page, "replay")
    await page.select_option("#replay-event-type", "InvoicePaid")
    await page.fill("#replay-form [name=created_from]", window["start"].isoformat())
    await page.fill("#replay-form [name=created_to]", window["stop"].isoformat())
    await page.click("#replay-dry-run")
    await expect(page.locator("#replay-plan-text")).to_contain_text(
        "Dry run: 3 Processed messages would be sent again"
    )
    await expect(page.locator("#replay-sample li")).to_have_count(3)
    assert len(receiver.to("/invoices")) == 3  # the dry run sent nothing
    await page.click("#replay-run")
    await page.click("#confirm-cancel")
    assert len(receiver.to("/invoices")) == 3  # nor did the cancelled confirmation
    await page.click("#replay-run")
    await confirm(page, "Send 3 Processed messages again", "event type InvoicePaid")
    await expect(page.locator("#replay-result")).to_contain_text("Replayed 3 messages")
    await receiver.wait_for(6, path="/invoices", timeout=60)
    assert sorted(r.webhook_id for r in receiver.to("/invoices")[3:]) == sorted(ids)
    await view(page, "audit")
    await expect(page.locator("#actions")).to_contain_text("replay", timeout=WAIT_MS)


async def test_the_audit_page_pages_and_filters(db: Any, console: str, browser: Browser) -> None:
    # 25 actions, a minute apart: 20 a page makes two pages; 13 of them pauses.
    await db.execute(
        "INSERT INTO outbox_console_actions (action_id, action, filter, affected, actor, "
        "created_at, result) SELECT 'seeded-' || n, CASE WHEN n % 2 = 0 THEN 'resume' "
        "ELSE 'pause' END, '{}', n, 'operator-' || n, now() - n * interval '1 minute', "
        "'{}' FROM generate_series(1, 25) AS n"
    )
    page, _ = await open_console(browser, console, KEY)
    await view(page, "audit")
    entries = page.locator("#actions tr").filter(has=page.locator("td"))
    await page.select_option("#audit-filter [name=limit]", "20")
    await page.click("#audit-search")
    await expect(entries).to_have_count(20)
    await expect(entries.first).to_contain_text("operator-1")
    await page.click("#audit-next")
    await expect(page.locator("#audit-page")).to_have_text("page 2")
    await expect(entries).to_have_count(5)
    await expect(entries.last).to_contain_text("operator-25")
    await expect(page.locator("#audit-next")).to_be_hidden()
    await page.click("#audit-first")
    await expect(entries).to_have_count(20)

    await page.select_option("#audit-filter [name=action]", "pause")
    await page.click("#audit-search")
    await expect(entries).to_have_count(13)
    for entry in await entries.all():
        await expect(entry.locator("td").nth(4)).to_have_text("pause")
    await page.fill("#audit-filter [name=actor]", "operator-7")
    await page.click("#audit-search")
    await expect(entries).to_have_count(1)
    await expect(entries.first).to_contain_text("operator-7")


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
    await db.execute(
        "INSERT INTO outbox_attempts (outbox_message_id, attempt_number, lease_token, "
        "started_at, finished_at, duration_ms, outcome, applied, http_status, error_class, "
        "error, response_snippet, endpoint) VALUES ($1, 1, gen_random_uuid(), now(), now(), "
        "12, 'Failed', true, 500, $2, $2, $2, $2)",
        message_id,
        HOSTILE,
    )
    page, dialogs = await open_console(browser, console, KEY)
    await search(page, status="Failed")
    await expect(rows(page)).to_have_count(1, timeout=WAIT_MS)
    await expect(page.locator("#messages")).to_contain_text("<script>window.__pwned=1</script>")
    await rows(page).first.locator("a.link").click()
    await expect(page.locator("#detail-payload")).to_contain_text("onerror")
    await expect(page.locator("#detail-facts")).to_contain_text("javascript:alert(1)")
    attempt = page.locator("#detail-attempts tr").nth(1)
    for column in (1, 6, 7, 8):  # endpoint, error class, error, response
        await expect(attempt.locator("td").nth(column)).to_have_text(HOSTILE)
    await view(page, "overview")
    await expect(page.locator("#reasons")).to_contain_text("HTTP 500")
    await db.execute(
        "INSERT INTO outbox_console_actions (action_id, action, filter, actor, address, "
        "user_agent, result) VALUES ('hostile', 'pause', jsonb_build_object('endpoint', $1::text), "
        "$1, $1, $1, jsonb_build_object('note', $1::text))",
        HOSTILE,
    )
    await view(page, "audit")
    entry = page.locator("#actions tr").nth(1)
    for column in (1, 2, 3):  # who, address, user agent
        await expect(entry.locator("td").nth(column)).to_have_text(HOSTILE)
    await expect(entry.locator("td").nth(5)).to_contain_text("<script>")
    assert await page.evaluate("typeof window.__pwned") == "undefined"
    assert await page.locator("img").count() == 0
    assert await page.locator("main script").count() == 0
    assert dialogs == []
    response = await page.request.get(console)
    policy = response.headers["content-security-policy"]
    assert "script-src 'nonce-" in policy
    assert "default-src 'none'" in policy
