"""What keeps the table in order while the queue runs: retention and schedules.

Both are plain functions over the manager (``retention.prune``,
``schedules.enqueue_due``), safe to run from any number of processes at once.
Every pool runs them as housekeeping; ``prune_intents`` and
``intents_schedules`` run or show them once.
"""
