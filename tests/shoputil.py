"""The example shop, installed for the test modules that exercise it (test_example*.py).

Installed in tests.settings, the shop's ``webhook`` and ``push`` handlers would
join every worker pool the other tests start, so each shop module installs it
for itself by importing ``shop_app``: an autouse fixture, module-scoped, so it
runs once per importing module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib import admin
from django.core.management import call_command
from django.test import override_settings

SHOP_SETTINGS: dict[str, Any] = {
    "ROOT_URLCONF": "example_project.urls",
    "SHOP_PARTNER_URL": "",
    "SHOP_RECEIVER_FAIL": 0.0,
    "SHOP_PARTNER_HANG": 6.0,
}


@pytest.fixture(scope="module", autouse=True)
def shop_app(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Install the shop, route URLs to the example project, and migrate its tables."""
    installed = [*settings.INSTALLED_APPS, "example_project.shop"]
    with override_settings(INSTALLED_APPS=installed, **SHOP_SETTINGS):
        with django_db_blocker.unblock():
            call_command("migrate", "shop", verbosity=0)
        # pytest-django runs transactional tests after the others, so this may be
        # the second installation: register the shop's admin again if need be.
        shop_admin = importlib.import_module("example_project.shop.admin")
        models = importlib.import_module("example_project.shop.models")
        for model, model_admin in (
            (models.Order, shop_admin.OrderAdmin),
            (models.PushLog, shop_admin.PushLogAdmin),
            (models.Receipt, shop_admin.ReceiptAdmin),
            (models.ReceivedWebhook, shop_admin.ReceivedWebhookAdmin),
        ):
            if not admin.site.is_registered(model):
                admin.site.register(model, model_admin)
        try:
            yield
        finally:
            with django_db_blocker.unblock():
                call_command("migrate", "shop", "zero", verbosity=0)
            # Left registered, the shop would break the admin index of other tests.
            for model in apps.get_app_config("shop").get_models():
                if admin.site.is_registered(model):
                    admin.site.unregister(model)
