"""Settings for processes of the previous release (tests/test_rolling_upgrade.py).

The test database of ``tests.settings``, and nothing the previous release's
code would not know: its app, the handlers app and the settings keys it had.
"""

from tests.settings import DATABASES

DATABASES = {"default": {**DATABASES["default"], "NAME": DATABASES["default"]["TEST"]["NAME"]}}
SECRET_KEY = "django-intents-upgrade"  # noqa: S105
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_intents", "tests.upgradeapp"]
INTENTS = {"LEASE": 5, "POLL_INTERVAL": 0.1}
