"""The example shop: how a Django project uses django-intents, end to end.

``python3 example_project/run.py`` sets it up and runs it; ``manage.py`` at the
top of the repository runs its management commands.
"""
