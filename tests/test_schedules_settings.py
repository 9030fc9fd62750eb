"""``INTENTS["SCHEDULES"]``: what the system check refuses, the command and the admin list.

Every refusal is one error naming the schedule and what is wrong, and a
broken setting leaves the table untouched.
"""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import Client, override_settings
from django.utils import timezone

from django_intents.conf import get_settings, parse
from django_intents.models import Intent
from django_intents.rules.cron import Schedule
from django_intents.schedules import enqueue_due

from .conftest import at, intents
from .test_admin import CHANGELIST

GOOD = {"cron": "*/5 * * * *", "kind": "job", "target": "t"}


def errors_of(schedules: Any) -> list[str]:
    return [str(error) for error in parse({"SCHEDULES": schedules})[1]]


@pytest.mark.parametrize(
    ("schedules", "message"),
    [
        (["a"], "must be a dict of name"),
        ({"": GOOD}, "has a bad name '': the name must not be empty"),
        ({"a:b": GOOD}, "':' separates the name"),
        ({"n" * 300: GOOD}, "the name is 300 characters long"),
        ({"d": "0 6 * * *"}, "['d'] must be a dict with 'cron', 'kind' and 'target'"),
        ({"d": {"kind": "job", "target": "t"}}, "['d'] is missing cron"),
        ({"d": {"cron": "0 6 * * *", "target": "t"}}, "['d'] is missing kind"),
        ({"d": {**GOOD, "every": 5}}, "['d'] has unknown key(s) every"),
        ({"d": {**GOOD, "cron": "* * * *"}}, "has 4 field(s); standard cron has five"),
        ({"d": {**GOOD, "cron": "0 * * * * *"}}, "has 6 field(s)"),
        ({"d": {**GOOD, "cron": "@daily"}}, "has 1 field(s)"),
        ({"d": {**GOOD, "cron": "0 0 L * *"}}, "the day of month field 'L' is not standard cron"),
        ({"d": {**GOOD, "cron": "0 0 * * 5L"}}, "the day of week field '5L' is not standard"),
        ({"d": {**GOOD, "cron": "0 0 * * MON#2"}}, "the day of week field 'MON#2' is not"),
        ({"d": {**GOOD, "cron": "0 0 ? * *"}}, "the day of month field '?' is not"),
        ({"d": {**GOOD, "cron": "61 * * * *"}}, "'61 * * * *': bad minute field"),
        ({"d": {**GOOD, "cron": "0 0 * FOO *"}}, "bad month field"),
        ({"d": {**GOOD, "cron": "0 0 30 2 *"}}, "bad day-of-month field"),
        ({"d": {**GOOD, "cron": 5}}, "cron must be a string, not int"),
        ({"d": {**GOOD, "tz": "Mars/Olympus"}}, "tz 'Mars/Olympus' is not a time zone"),
        ({"d": {**GOOD, "tz": ""}}, "tz must be a zoneinfo name"),
        ({"d": {**GOOD, "catch_up": "some"}}, "catch_up must be one of latest, all, none"),
        ({"d": {**GOOD, "kind": ""}}, "['d']: kind must not be empty"),
        ({"d": {**GOOD, "target": "x" * 3000}}, "target is 3000 characters long"),
        ({"d": {**GOOD, "payload": {1, 2}}}, "payload is a set, which is not a JSON value"),
    ],
)  # fmt: skip
def test_a_bad_schedule_is_one_error_naming_what_is_wrong(schedules, message):
    errors = errors_of(schedules)
    assert len(errors) == 1, errors
    assert errors[0].startswith("INTENTS['SCHEDULES'] ")
    assert message in errors[0]


def test_a_good_schedule_reads_with_its_defaults():
    built, errors = parse({"SCHEDULES": {"d": {**GOOD, "cron": "0  6 * *  mon-fri"}}})
    assert errors == []
    assert built.schedules == {
        "d": Schedule(name="d", cron="0 6 * * mon-fri", kind="job", target="t")
    }
    assert (built.schedules["d"].tz, built.schedules["d"].catch_up) == ("UTC", "latest")


@pytest.mark.django_db
def test_a_bad_schedule_fails_the_system_check_and_enqueues_nothing():
    with (
        override_settings(INTENTS=intents(SCHEDULES={"d": {**GOOD, "tz": "Europe/Pariss"}})),
        pytest.raises(SystemCheckError, match=r"INTENTS\['SCHEDULES'\].*Europe/Pariss"),
    ):
        call_command("check")
    assert Intent.objects.count() == 0


@pytest.mark.django_db
def test_a_schedule_whose_kind_nothing_runs_fails_the_check_and_enqueues_nothing():
    with override_settings(INTENTS=intents(SCHEDULES={"d": {**GOOD, "kind": "jobs"}})):
        found = [m for m in run_checks() if m.id.startswith("django_intents.")]
        with pytest.raises(ValueError, match="unknown kind 'jobs'"):
            enqueue_due(now=at(1))
    assert [(m.id, m.obj) for m in found] == [("django_intents.E008", "INTENTS['SCHEDULES']['d']")]
    assert "did you mean 'job'?" in found[0].msg
    assert Intent.objects.count() == 0


# -- manage.py intents_schedules ------------------------------------------------------------

SCHEDULES = {
    "digest": {"cron": "0 6 * * *", "kind": "job", "target": "t", "tz": "Europe/Paris"},
    "tick": {"cron": "* * * * *", "kind": "push", "target": "t"},
}


def next_slot(name: str) -> str:
    slot = get_settings().schedules[name].after(timezone.now())
    assert slot is not None
    return slot.strftime("%Y-%m-%dT%H:%M:%SZ")


def schedules_output(*args: str) -> list[list[str]]:
    out = StringIO()
    call_command("intents_schedules", *args, stdout=out)
    return [line.split("\t") for line in out.getvalue().splitlines()]


@pytest.mark.django_db
@override_settings(INTENTS=intents(SCHEDULES=SCHEDULES))
def test_the_command_prints_each_schedule_with_its_last_and_next_slot_in_utc():
    now = timezone.now()
    enqueue_due(now=now, kinds=["push"])
    enqueue_due(now=now - timedelta(minutes=5), kinds=["push"])
    last_tick = Intent.objects.order_by("-next_at").values_list("next_at", flat=True)[0]
    lines = schedules_output()
    assert lines == [
        ["digest", "0 6 * * *", "Europe/Paris", "-", next_slot("digest")],
        ["tick", "* * * * *", "UTC", last_tick.strftime("%Y-%m-%dT%H:%M:%SZ"), lines[1][4]],
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", lines[1][4])
    assert lines[1][4] > lines[1][3]


@pytest.mark.django_db
def test_the_command_says_when_there_are_no_schedules():
    assert schedules_output() == [["no schedules (INTENTS['SCHEDULES'] is empty)"]]


@pytest.mark.django_db
def test_the_command_refuses_an_unknown_database_alias_and_writes_nothing():
    with pytest.raises(CommandError, match="unknown database alias 'elsewhere'"):
        call_command("intents_schedules", "--database", "elsewhere")
    assert Intent.objects.count() == 0


@pytest.mark.django_db
@override_settings(INTENTS=intents(SCHEDULES=SCHEDULES))
def test_the_command_reads_the_database_it_is_given():
    enqueue_due(kinds=["push"])
    assert [line[3] != "-" for line in schedules_output("--database", "default")] == [False, True]


# -- the admin ---------------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(INTENTS=intents(SCHEDULES=SCHEDULES))
def test_the_admin_list_shows_each_schedule_with_its_last_and_next_slot(admin_client: Client):
    [id] = enqueue_due(kinds=["push"])[-1:]
    last = Intent.objects.get(pk=id).next_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    page = admin_client.get(CHANGELIST).content.decode()
    assert 'aria-labelledby="intents-schedules-title"' in page
    row = re.search(r'<tr data-schedule="tick">(.*?)</tr>', page, re.S)
    assert row is not None
    assert f'<td data-slot="last">{last}</td>' in row.group(1)
    assert "<code>* * * * *</code>" in row.group(1)
    digest = re.search(r'<tr data-schedule="digest">(.*?)</tr>', page, re.S)
    assert digest is not None
    assert '<td data-slot="last">—</td>' in digest.group(1)
    assert f'<td data-slot="next">{next_slot("digest")}</td>' in digest.group(1)


@pytest.mark.django_db
def test_the_admin_list_has_no_schedule_section_without_schedules(admin_client: Client):
    page = admin_client.get(CHANGELIST).content.decode()
    assert "intents-schedules-title" not in page
