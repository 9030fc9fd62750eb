from collections.abc import Mapping

from django.apps import AppConfig
from django.conf import settings


class IntentsConfig(AppConfig):
    name = "django_intents"
    verbose_name = "Intents"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_intents import checks  # noqa: F401 - importing checks registers them
        from django_intents.observability import metrics, rollup

        metrics.connect()
        rollup.connect()  # the dashboard's per-minute counts
        if _uses_task_backend():
            # The worker pool runs the kinds in the handler registry, but it never
            # builds task backends (django.tasks makes them lazily, on first use),
            # so the task runner is registered here, in every process. Only when
            # TASKS names the backend: Django 5.2 without the backport must never
            # import django_intents.tasks.
            from django_intents.tasks import register_handler

            register_handler()


def _uses_task_backend() -> bool:
    """True when ``TASKS`` names a backend in ``django_intents.tasks``, read without importing."""
    tasks = getattr(settings, "TASKS", None)
    return isinstance(tasks, Mapping) and any(
        isinstance(params, Mapping)
        and str(params.get("BACKEND", "")).startswith("django_intents.tasks.")
        for params in tasks.values()
    )
