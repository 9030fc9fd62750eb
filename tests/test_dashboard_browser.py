"""The dashboard and the Targets page in a real browser, drawn at a laptop's width.

Chromium opens the page at 1280 px as a superuser, checks that every kind has
its four charts and that the page does not scroll sideways, and takes a
screenshot; with ``INTENTS_UPDATE_SCREENSHOT=1`` the screenshot replaces
``docs/img/dashboard.png``. The Targets page is listed, a target held and
another closed through its buttons; its screenshot is
``docs/img/admin-targets-1280.png``. Without Playwright or Chromium the test skips (fails
under ``CI``), as ``test_browser.py`` does.
"""

from __future__ import annotations

import math
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from django_intents.models import Intent, Rollup, TargetState
from django_intents.observability.rollup import minute_of
from django_intents.rules.targets import target_key
from django_intents.store.clock import server_now

from .conftest import external_kinds
from .test_browser import CHROMIUM_ARGS, PASSWORD, USERNAME, browser_tools

SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "dashboard.png"
KINDS = ("webhook", "push", "replication", "report")


def a_day_of_rollup() -> None:
    """A day of plausible minutes: a daily wave of webhooks with an outage of the
    partner two hours ago, steady pushes, slow replication, an hourly report."""
    end = minute_of(server_now())
    rows = []
    # From the next minute back: a page drawn after the minute turns still has
    # every minute of its hour filled.
    for back in range(-1, 24 * 60):
        minute = end - timedelta(minutes=back)
        wave = 1 + math.sin(back / 1440 * 2 * math.pi)
        outage = 100 <= back <= 140
        webhook = round(20 * wave)
        rows.append(
            Rollup(
                minute=minute,
                kind="webhook",
                completed=0 if outage else webhook,
                failed=webhook if outage else back % 7 == 0,
                snoozed=2 if back % 11 == 0 else 0,
                attempts=webhook + 1,
                duration_sum=0.3 * (webhook + 1),
                duration_max=2.5 if outage else 0.9,
                due=(140 - back) * 12 if 100 <= back <= 140 else round(3 * wave),
                running=4,
            )
        )
        rows.append(
            Rollup(
                minute=minute,
                kind="push",
                completed=8 + back % 5,
                cancelled=1 if back % 13 == 0 else 0,
                attempts=9 + back % 5,
                duration_sum=0.02 * (9 + back % 5),
                duration_max=0.08,
                due=back % 3,
                running=1,
            )
        )
        rows.append(
            Rollup(
                minute=minute,
                kind="replication",
                completed=2,
                failed=1 if back % 30 == 0 else 0,
                attempts=2,
                duration_sum=2 * 7.5,
                duration_max=21.0,
                due=5 + back % 4,
                running=2,
            )
        )
        if back % 60 == 3:
            rows.append(
                Rollup(
                    minute=minute,
                    kind="report",
                    completed=1,
                    attempts=1,
                    duration_sum=41.0,
                    duration_max=41.0,
                )
            )
    Rollup.objects.bulk_create(rows)


def a_queue() -> None:
    now = server_now()
    for i in range(3):
        Intent.objects.enqueue(
            "webhook",
            f"order-10{i}-paid",
            "https://partner.example/hooks/orders",
            None,
            next_at=now - timedelta(minutes=20 - i),
        )
    running = Intent.objects.enqueue("replication", "invoice-9", "db-eu-2", None)
    Intent.objects.filter(pk=running).update(
        state="running",
        attempts=1,
        claim_token="a" * 32,
        claim_until=now + timedelta(minutes=10),
        updated_at=now - timedelta(minutes=4),
    )
    Intent.objects.pause("report")


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_in_a_real_browser(
    live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    sync_playwright, chromium = browser_tools()
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    with external_kinds(*KINDS):
        a_day_of_rollup()
        a_queue()
    dashboard = f"{live_server.url}/admin/django_intents/intent/dashboard/"
    shot = tmp_path / "dashboard.png"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(
                f"{live_server.url}/admin/login/?next=/admin/django_intents/intent/dashboard/"
            )
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(dashboard)
            for kind in KINDS:
                assert page.locator(f'tr[data-kind="{kind}"] svg').count() == 4
            assert page.locator('[data-dashboard="empty"]').count() == 0
            hour = page.locator('tr[data-kind="push"] .intents-chart-outcomes').first
            assert hour.locator(".intents-hit title").count() == 60  # a tooltip a minute
            assert page.locator('[data-paused-kind="report"]').count() == 1
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, f"the page scrolls sideways: {width} px wide"
            page.screenshot(path=str(shot), full_page=True)
            # The admin's dark theme recolours the charts through its CSS variables.
            page.emulate_media(color_scheme="dark")
            page.screenshot(path=str(tmp_path / "dashboard-dark.png"), full_page=True)
        finally:
            browser.close()

    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("INTENTS_UPDATE_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


def unhealthy_targets() -> None:
    """A partner down (its breaker open), one probing, one held by a 429, one failing."""
    now = server_now()
    rows = [
        (
            "webhook",
            "https://partner.example/hooks/orders",
            "open",
            5,
            240,
            "HTTP 503 Service Unavailable",
        ),
        (
            "webhook",
            "https://crm.example/api/v2/contacts/sync?tenant=acme-industries-europe",
            "half_open",
            5,
            None,
            "ConnectTimeout: 10 s",
        ),
        (
            "push",
            "apns:device-7f3a",
            "held",
            0,
            900,
            "HTTP 429 Too Many Requests (Retry-After: 900)",
        ),
        ("replication", "db-eu-2", "closed", 2, None, "deadlock detected"),
    ]
    for kind, target, state, failures, seconds, error in rows:
        TargetState.objects.create(
            key=target_key(kind, target),
            kind=kind,
            target=target,
            state=state,
            failures=failures,
            until=None if seconds is None else now + timedelta(seconds=seconds),
            last_error=error,
            updated_at=now,
        )
    for i in range(14):
        Intent.objects.enqueue("webhook", f"order-{i}", "https://partner.example/hooks/orders")
    Intent.objects.enqueue("push", "badge-1", "apns:device-7f3a")


@pytest.mark.django_db(transaction=True)
def test_the_targets_page_in_a_real_browser(
    live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    sync_playwright, chromium = browser_tools()
    django_user_model.objects.create_superuser(USERNAME, "operator@example.com", PASSWORD)
    with external_kinds(*KINDS):
        unhealthy_targets()
    targets = f"{live_server.url}/admin/django_intents/intent/targets/"
    shot = tmp_path / "admin-targets-1280.png"

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{live_server.url}/admin/login/?next=/admin/django_intents/intent/targets/")
            page.fill("#id_username", USERNAME)
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url(targets)
            assert page.locator("tr[data-target]").count() == 4
            orders = page.locator('tr[data-target="https://partner.example/hooks/orders"]')
            assert orders.locator("[data-pending]").inner_text() == "14"
            page.screenshot(path=str(shot), full_page=True)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 1280, f"the page scrolls sideways: {width} px wide"
            # Hold the failing replica for ten minutes, as an operator would.
            replica = page.locator('tr[data-target="db-eu-2"]')
            replica.locator('input[name="seconds"]').fill("600")
            replica.locator('button[name="hold"]').click()
            page.wait_for_url(targets)
            message = page.locator(".messagelist .success").inner_text()
            assert "Held target “db-eu-2” of kind “replication” for 600 s" in message
            state = page.locator('tr[data-target="db-eu-2"] [data-state]').inner_text()
            assert state == "held"
            # Close the partner's breaker now.
            orders.locator('button[name="close"]').click()
            page.wait_for_url(targets)
            assert page.locator("tr[data-target]").count() == 3
        finally:
            browser.close()

    assert TargetState.objects.get(target="db-eu-2").state == "held"
    assert not TargetState.objects.filter(target="https://partner.example/hooks/orders").exists()
    assert shot.read_bytes().startswith(b"\x89PNG")
    if os.environ.get("INTENTS_UPDATE_SCREENSHOT"):
        shutil.copyfile(shot, SCREENSHOT.parent / "admin-targets-1280.png")
