from django.apps import AppConfig


class IntentsConfig(AppConfig):
    name = "django_intents"
    verbose_name = "Intents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
