"""The tables: an intent and its state machine, the paused kinds, the rollup, the targets' health.

The state names, the claim order and the column sizes come from ``rules/``,
where the store reads them too; the constraints hold the state machine's
invariants in the database whatever process writes.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.checks import CheckMessage
from django.db import connections, models
from django.db.models import Q

from django_intents.managers import IntentManager
from django_intents.rules import states
from django_intents.rules.identity import ID_LENGTH, MAX_LENGTHS
from django_intents.rules.states import State
from django_intents.rules.targets import TargetHealth
from django_intents.rules.validation import PRIORITY_RANGE
from django_intents.store import partial_indexes_served
from django_intents.tracing import MAX_CONTEXT

# Claimable: what the claim's indexes hold. Spelled as OR, like the claim's
# SQL: PostgreSQL proves the claim may use a partial index only when the two
# texts match.
CLAIMABLE = Q(state=State.PENDING) | Q(state=State.RUNNING)


class Intent(models.Model):
    State = states.State
    ACTIVE_STATES: ClassVar[tuple[str, ...]] = states.ACTIVE
    TERMINAL_STATES: ClassVar[tuple[str, ...]] = states.TERMINAL

    id = models.CharField(primary_key=True, max_length=ID_LENGTH)
    kind = models.CharField(max_length=MAX_LENGTHS["kind"])
    event_id = models.CharField(max_length=MAX_LENGTHS["event_id"])
    target = models.CharField(max_length=MAX_LENGTHS["target"])
    payload = models.JSONField(null=True, blank=True)
    state = models.CharField(
        max_length=max(len(value) for value in State.values),
        choices=State.choices,
        default=State.PENDING,
    )
    attempts = models.PositiveIntegerField(default=0)
    # Claims that ended in a snooze (``Retry(after=...)``): MAX_ATTEMPTS and
    # the backoff count ``attempts - snoozes``. The database default lets a
    # process of the previous release, which does not name the column, still
    # enqueue while a deployment rolls out.
    snoozes = models.PositiveIntegerField(default=0, db_default=0)
    # Attempts a redrive wrote off (SPEC §14): the count is ``attempts - snoozes
    # - written_off`` (``rules.retries.counted``), so a redriven intent gets its
    # budget afresh while ``attempts`` keeps its history. The database default
    # serves processes of the previous release.
    written_off = models.PositiveIntegerField(default=0, db_default=0)
    # Higher runs first among due intents (SPEC §11). The database default
    # lets a process of the previous release, which does not name the column,
    # still enqueue while a deployment rolls out.
    priority = models.SmallIntegerField(default=0, db_default=0)
    next_at = models.DateTimeField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    # The tail of the last failure's traceback, written with last_error (docs/workers.md).
    # The database default serves processes of the previous release.
    last_traceback = models.TextField(blank=True, default="", db_default="")
    claim_token = models.CharField(max_length=32, blank=True, default="")
    claim_until = models.DateTimeField(null=True, blank=True)
    # The W3C trace context of the span that enqueued the intent (JSON), which
    # each attempt's span links to (``tracing.py``); empty without the otel
    # extra. The database default serves processes of the previous release.
    trace_context = models.CharField(max_length=MAX_CONTEXT, blank=True, default="", db_default="")

    objects = IntentManager()

    class Meta:
        ordering = states.CLAIM_ORDER
        indexes = (
            # The claim walks this index in claim order for the default priority
            # 0; the trailing ``priority`` lets it step over other priorities
            # without reading their rows. Terminal rows are not in it, so
            # claiming costs the same with a million completed rows. MySQL and
            # MariaDB have no partial indexes: migrations 0002 and 0007 add full ones.
            models.Index(
                fields=("next_at", "created_at", "id", "priority"),
                condition=CLAIMABLE,
                name="intents_claimable_idx",
            ),
            # Intents with a priority above 0, and below 0, each in claim order:
            # usually few, so the claim's branches for them cost a lookup in a
            # small index (the three branches of ``store/sql/common.sql``). Two indexes, not one:
            # each branch's condition is its index's, so the planner has no
            # priority test to estimate and walks the index in order.
            models.Index(
                fields=states.CLAIM_ORDER,
                condition=CLAIMABLE & Q(priority__gt=0),
                name="intents_high_priority_idx",
            ),
            models.Index(
                fields=states.CLAIM_ORDER,
                condition=CLAIMABLE & Q(priority__lt=0),
                name="intents_low_priority_idx",
            ),
            models.Index(
                fields=("claim_until",),
                condition=Q(state=State.RUNNING),
                name="intents_lease_idx",
            ),
            # Counts per kind and state, the kind filter and the list of kinds, and
            # a search by event id as one lookup per kind and state (admin/changelist.py).
            models.Index(fields=("kind", "state", "event_id"), name="intents_kind_state_event_idx"),
            # The admin's list, newest first (ties by id, as Django orders it), without
            # sorting the table.
            models.Index(fields=("created_at", "id"), name="intents_created_idx"),
            # Retention walks finished rows by age; partial so that the claim
            # planner is never tempted by an index that leads with state.
            models.Index(
                fields=("updated_at",),
                condition=Q(state=State.COMPLETED) | Q(state=State.CANCELLED),
                name="intents_finished_idx",
            ),
        )
        constraints = (
            models.CheckConstraint(
                condition=Q(state__in=states.ALL),
                name="intents_state_valid",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_RANGE[0]) & Q(priority__lte=PRIORITY_RANGE[1]),
                name="intents_priority_range",
            ),
            models.CheckConstraint(
                condition=~Q(state=State.RUNNING) | Q(claim_until__isnull=False),
                name="intents_running_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(state=State.RUNNING) | Q(claim_token=""),
                name="intents_claim_only_when_running",
            ),
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.id[:12]} ({self.state})"

    @classmethod
    def check(cls, **kwargs: Any) -> list[CheckMessage]:
        """Django's model checks, less ``models.W037`` where migrations make up for it.

        W037 says a database without partial indexes ignores their conditions,
        and asks whoever cares to act. On MySQL and MariaDB this app has:
        migrations 0002 and 0007 add full indexes led by the state in place of
        the partial ones, so the warning would only teach every operator to
        silence W037 for all their models. ``required_db_features`` is not the
        way out: it also stops the model from being migrated on such a
        database. Another database without partial indexes (none is
        supported) still gets the warning.
        """
        messages = super().check(**kwargs)
        made_up = all(
            partial_indexes_served(connections[alias]) for alias in kwargs.get("databases") or ()
        )
        return [m for m in messages if not (made_up and m.id == "models.W037")]


class PausedKind(models.Model):
    """A kind no claim takes until it is resumed (``Intent.objects.pause``)."""

    kind = models.CharField(primary_key=True, max_length=MAX_LENGTHS["kind"])
    paused_at = models.DateTimeField()

    class Meta:
        ordering = ("kind",)

    def __str__(self) -> str:
        return self.kind


class Rollup(models.Model):
    """What the pools did with one kind in one minute, and how deep its queue was then.

    Written by the pools (``observability/rollup.py``), read by the admin's
    dashboard: a few rows a minute, kept for two days, so the dashboard's
    charts never read the intents table.
    """

    minute = models.DateTimeField()  # the minute's start, UTC
    kind = models.CharField(max_length=MAX_LENGTHS["kind"])
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    snoozed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)  # every finished attempt, fenced ones too
    duration_sum = models.FloatField(default=0.0)  # seconds, over ``attempts``
    duration_max = models.FloatField(default=0.0)
    due = models.PositiveIntegerField(null=True)  # sampled once a minute; NULL: not sampled
    running = models.PositiveIntegerField(null=True)

    class Meta:
        constraints = (
            models.UniqueConstraint(fields=("minute", "kind"), name="intents_rollup_minute_kind"),
        )

    def __str__(self) -> str:
        return f"{self.kind} {self.minute:%Y-%m-%d %H:%M}"


class TargetState(models.Model):
    """One (kind, target) that is not plainly healthy: held, open, half-open, or failing.

    A row exists only while a target needs one (SPEC §14: a row per unhealthy
    target, never per intent) and is deleted once the target is healthy
    again. The key is ``rules/targets.target_key(kind, target)``: a target
    may be 2,048 characters, too long for a unique index beside its kind on
    MySQL, so the row is found by a hash of both.
    """

    key = models.CharField(primary_key=True, max_length=64)
    kind = models.CharField(max_length=MAX_LENGTHS["kind"])
    target = models.CharField(max_length=MAX_LENGTHS["target"])
    state = models.CharField(
        max_length=max(len(value) for value in TargetHealth),
        choices=[(value.value, value.value.replace("_", "-")) for value in TargetHealth],
        default=TargetHealth.CLOSED.value,
    )
    failures = models.PositiveIntegerField(default=0)  # consecutive failed attempts
    # consecutive openings: how often the cooldown has doubled
    openings = models.PositiveIntegerField(default=0)
    until = models.DateTimeField(null=True, blank=True)  # when it may be tried again
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField()
    # The intent out as a half-open target's probe; "" while half-open: the
    # next claim of a pool that read the row may take one (rules/targets.Health).
    probe = models.CharField(max_length=ID_LENGTH, blank=True, default="")
    # The pace a handler's hold teaches (rules/targets.learned_pace): when the
    # hold began, and when the pace is over; ``until`` keeps the hold's end.
    held_at = models.DateTimeField(null=True, blank=True)
    paced_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("kind", "target")
        indexes = (
            # The paced targets a pool's claims read twice a second (store/targets.paces).
            models.Index(fields=("paced_until",), name="intents_targets_paced"),
            models.Index(fields=("kind", "state"), name="intents_targets_kind_state"),
            # The targets that block, by state (PostgreSQL's claims read them as
            # a set, the pools' watch and sweep by state): the rows of targets
            # that only count failures are not read. SQLite and MySQL also look
            # intents up by (kind, target): an index migration 0016 makes, a
            # prefix one on MySQL, whose keys cannot hold a whole target.
            models.Index(fields=("state", "until"), name="intents_targets_state_until"),
        )

    def __str__(self) -> str:
        return f"{self.kind} → {self.target}: {self.state}"


class TargetStart(models.Model):
    """One attempt of a rated kind that started for a target (SPEC §14 ``rate``).

    A claim of a kind with a ``rate`` counts its target's rows inside the
    rate's window, under the kind's limit lock, and writes one row per intent
    it takes: a claim is a start, an expired lease's re-claim included. Rows
    older than the window are pruned by the same claims, so the table holds
    about ``N`` rows per target that started lately. ``target_key`` is
    ``rules/targets.target_key(kind, target)``: exact on every database (the
    ``target`` column compares case-insensitively on MySQL), and short.
    """

    target_key = models.CharField(max_length=64)
    kind = models.CharField(max_length=MAX_LENGTHS["kind"])
    target = models.CharField(max_length=MAX_LENGTHS["target"])
    started_at = models.DateTimeField()

    class Meta:
        indexes = (models.Index(fields=("kind", "started_at"), name="intents_starts_kind_at"),)

    def __str__(self) -> str:
        return f"{self.kind} → {self.target} at {self.started_at:%Y-%m-%d %H:%M:%S}"
