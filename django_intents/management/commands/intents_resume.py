"""``manage.py intents_resume KIND...``: let pools claim paused kinds again."""

from __future__ import annotations

from django_intents.management.commands.intents_pause import Command as PauseCommand
from django_intents.managers import IntentManager


class Command(PauseCommand):
    help = (
        "Resume paused kinds: pools claim their intents again from their next claim on, "
        "oldest first, as if they had never been paused."
    )
    done, unchanged = "resumed", "not paused"

    def change(self, manager: IntentManager, kind: str) -> bool:
        return manager.resume(kind)
