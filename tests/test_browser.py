"""A real browser drives the admin: Playwright for Python with Debian's Chromium.

An operator logs in, filters the list to failing intents, selects them and runs
**Retry now**; the test checks the page's message and then the rows. The
Playwright-managed browsers are not used (``playwright install`` needs the
network); the system ``chromium`` is launched through ``executable_path``.

Without Playwright or Chromium the test skips on a laptop, but fails when the
``CI`` environment variable is set, so CI can never pass by not running it.

At a laptop's width (1280 px, the navigation sidebar open) the list must fit
without scrolling sideways, and **Cancel** must ask on a page of its own before
anything changes.

Screenshots are always taken; with ``INTENTS_UPDATE_SCREENSHOT=1`` they also
replace ``docs/img/admin.png`` and the 1280 px ones in ``docs/img/`` (kept out
of ordinary runs so that a test run does not rewrite a tracked file).
"""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_intents.models import Intent

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "img"
SCREENSHOT = IMAGES / "admin.png"
LAPTOP = {"width": 1280, "height": 800}
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
USERNAME, PASSWORD = "operator", "correct horse battery staple"


def browser_tools() -> tuple[Any, str]:
    """Return ``(sync_playwright, chromium path)``, or skip (fail under CI) saying what is missing."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
        missing.append("Playwright for Python (pip install playwright)")
    chromium = shutil.which("chromium")
    if chromium is None:
        missing.append("Chromium (apt-get install chromium)")
    if missing:
        reason = "the browser test needs " + " and ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this is a failure, not a skip")
        pytest.skip(reason)
    assert chromium is not None
    return sync_playwright, chromium


def queue(target: str = "https://partner.example/hooks/orders") -> dict[str, str]:
    """A small, realistic queue: every state, several kinds, two failing webhooks."""
    now = timezone.now()

    def put(kind: str, event: str, minutes_ago: float, **fields: Any) -> str:
        at = now - timedelta(minutes=minutes_ago)
        id = Intent.objects.enqueue(kind, event, target, {"event": event}, now=at)
        Intent.objects.filter(pk=id).update(updated_at=at, **fields)
        return id

    running = {"state": "running", "attempts": 1, "claim_token": "a" * 32}
    return {
        "failing-1": put(
            "webhook",
            "order-1041-paid",
            25,
            attempts=4,
            next_at=now + timedelta(minutes=12),
            last_error="HTTP 502 Bad Gateway from partner.example",
        ),
        "failing-2": put(
            "webhook",
            "order-1042-paid",
            20,
            attempts=3,
            next_at=now + timedelta(minutes=6),
            last_error="ConnectTimeout: partner.example:443 after 10 s",
        ),
        "due": put("push", "user-77-mention", 3, next_at=now - timedelta(minutes=3)),
        "later": put("job", "nightly-report", 1, next_at=now + timedelta(hours=5)),
        "running": put(
            "replication",
            "invoice-9-created",
            2,
            claim_until=now + timedelta(minutes=10),  # outlives a slow browser start in CI
            **running,
        ),
        "completed": put("webhook", "order-1040-paid", 40, state="completed", attempts=1),
        "cancelled": put(
            "push", "user-12-mention", 90, state="cancelled", attempts=2, last_error="device gone"
        ),
    }


@pytest.mark.django_db(transaction=True)
def test_operator_retries_failing_intents_in_a_real_browser(
    live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    sync_playwright, chromium = browser_tools()
    # Playwright's sync API runs an asyncio loop on this thread while its block is
    # open, and Django refuses ORM calls from a thread with a running loop
    # (SynchronousOnlyOperation). So the rows are set up before the block and
    # checked after it, and DJANGO_ALLOW_ASYNC_UNSAFE is not needed.
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    ids = queue()
    changelist = f"{live_server.url}/admin/django_intents/intent/"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_intents/intent/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(changelist)

            summary = page.locator(".intents-summary")
            assert summary.locator('[data-state="pending"]').inner_text() == "4"
            assert summary.locator('[data-summary="due"]').inner_text() == "1"
            page.click("#toggle-nav-sidebar")  # more room for the list in the screenshot
            shot = tmp_path / "admin.png"
            page.screenshot(path=str(shot), full_page=True)

            filters = page.locator("#changelist-filter")
            filters.get_by_role("link", name="Pending", exact=True).click()
            page.wait_for_url("**state__exact=pending**")
            filters.get_by_role("link", name="Has an error", exact=True).click()
            page.wait_for_url("**error=yes**")
            boxes = page.locator('input[name="_selected_action"]')
            shown = sorted(boxes.evaluate_all("boxes => boxes.map(b => b.value)"))
            assert shown == sorted([ids["failing-1"], ids["failing-2"]])

            for key in ("failing-1", "failing-2"):
                page.check(f'input[name="_selected_action"][value="{ids[key]}"]')
            page.select_option('select[name="action"]', "retry_now")
            before = timezone.now()
            page.click('button[name="index"]')
            page.wait_for_load_state()

            message = page.locator(".messagelist .success")
            assert message.inner_text() == "Scheduled 2 intents to run now."
            assert page.locator(".messagelist .warning").count() == 0
            for key in ("failing-1", "failing-2"):
                cell = page.locator(f'tr:has(input[value="{ids[key]}"]) td.field-next_run')
                assert cell.inner_text() in ("now", "1 s ago", "2 s ago", "3 s ago")
        finally:
            browser.close()

    after = timezone.now()
    for key in ("failing-1", "failing-2"):
        intent = Intent.objects.get(pk=ids[key])
        assert intent.state == "pending"
        assert before - timedelta(seconds=1) <= intent.next_at <= after
        # Retry now keeps the last error: it is what the operator is retrying.
        assert intent.last_error
    untouched = Intent.objects.get(pk=ids["later"])
    assert untouched.next_at > after + timedelta(hours=4)
    assert Intent.objects.get(pk=ids["running"]).state == "running"

    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("INTENTS_UPDATE_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


def keep(shot: Path, name: str) -> None:
    """Replace ``docs/img/<name>`` with ``shot`` when asked to (``INTENTS_UPDATE_SCREENSHOT``)."""
    if os.environ.get("INTENTS_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, IMAGES / name)


def scrolls_sideways(page: Any) -> bool:
    """Whether the page, or the list inside its own scrolling box, is wider than the window."""
    return bool(
        page.evaluate(
            """() => [document.documentElement, ...document.querySelectorAll(".results")]
                .some(box => box.scrollWidth > box.clientWidth)"""
        )
    )


@pytest.mark.django_db(transaction=True)
def test_list_fits_a_laptop_and_cancel_asks_first_in_a_real_browser(
    live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    sync_playwright, chromium = browser_tools()
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    long_target = "https://hooks.partner.example/v2/accounts/acct_7Hq2Lm9xZ/webhooks/orders"
    ids = queue(long_target)
    changelist = f"{live_server.url}/admin/django_intents/intent/"
    change = f"{changelist}{ids['failing-1']}/change/"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_intents/intent/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(changelist)
            assert page.locator("#nav-sidebar").is_visible()

            assert not scrolls_sideways(page)
            row = page.locator(f'tr:has(input[value="{ids["failing-1"]}"])')
            target = row.locator(".intents-target")
            assert target.get_attribute("title") == long_target
            assert len(target.evaluate("cell => cell.getClientRects()")) == 1  # one line
            for key in ("completed", "cancelled"):
                finished = page.locator(f'tr:has(input[value="{ids[key]}"]) td.field-next_run')
                assert finished.inner_text() == "-"
            page.screenshot(path=str(tmp_path / "list.png"), full_page=True)

            page.goto(change)
            assert not scrolls_sideways(page)
            page.screenshot(path=str(tmp_path / "detail.png"), full_page=True)

            page.click("button.intents-button-cancel")
            page.wait_for_load_state()
            assert page.locator("h1").inner_text() == "Are you sure?"
            assert page.locator(".intents-confirm-list .intents-target").count() == 1
            page.screenshot(path=str(tmp_path / "cancel.png"), full_page=True)
        finally:
            browser.close()
    # Asked, not yet confirmed: nothing changed.
    assert Intent.objects.get(pk=ids["failing-1"]).state == "pending"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.goto(f"{live_server.url}/admin/login/?next={change[len(live_server.url) :]}")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(change)
            page.click("button.intents-button-cancel")
            page.wait_for_load_state()
            page.click('input[type=submit][value="Yes, I’m sure"]')
            page.wait_for_url(change)
            assert page.locator(".messagelist .success").inner_text() == "Cancelled 1 intent."
        finally:
            browser.close()
    assert Intent.objects.get(pk=ids["failing-1"]).state == "cancelled"
    for shot, name in (
        ("list.png", "admin-list-1280.png"),
        ("detail.png", "admin-detail-1280.png"),
        ("cancel.png", "admin-cancel-1280.png"),
    ):
        keep(tmp_path / shot, name)
