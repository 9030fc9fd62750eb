"""The dashboard in a real browser: a day of rollup rows, drawn at a laptop's width.

Chromium opens the page at 1280 px as a superuser, checks that every kind has
its four charts and that the page does not scroll sideways, and takes a
screenshot; with ``INTENTS_UPDATE_SCREENSHOT=1`` the screenshot replaces
``docs/img/dashboard.png``. Without Playwright or Chromium the test skips (fails
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

from django_intents.models import Intent, Rollup
from django_intents.observability.rollup import minute_of
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
