"""Kind names the app itself owns.

A leaf module: the settings defaults (``conf.py``) and the task backend
(``tasks/``) both need the task kind, and ``django_intents.tasks`` must never
be imported on Django 5.2 without the django-tasks backport.
"""

# The one kind every django.tasks intent has: the worker pool runs them all with one handler.
TASK_KIND = "django.tasks"
