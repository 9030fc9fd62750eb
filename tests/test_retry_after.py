"""``retry_after(headers)``: the seconds a partner asks for, from any client's headers (SPEC §14)."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from django_intents import retry_after

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
NAMES = ("Retry-After", "RateLimit-Reset", "X-RateLimit-Reset")


def http_date(when: datetime) -> str:
    return format_datetime(when, usegmt=True)


def test_retry_after_in_seconds():
    assert retry_after({"Retry-After": "120"}, now=NOW) == 120.0


def test_retry_after_as_an_http_date_counts_from_now():
    assert retry_after({"Retry-After": http_date(NOW + timedelta(seconds=90))}, now=NOW) == 90.0


def test_the_obsolete_http_date_forms_are_read_as_gmt():
    """RFC 850 and asctime dates, which a recipient must accept (RFC 9110 §5.6.7)."""
    assert retry_after({"Retry-After": "Saturday, 05-Dec-26 12:01:00 GMT"}, now=NOW) == 60.0
    assert retry_after({"Retry-After": "Sat Dec  5 12:02:00 2026"}, now=NOW) == 120.0


def test_a_date_in_the_past_is_zero_not_negative():
    assert retry_after({"Retry-After": http_date(NOW - timedelta(hours=1))}, now=NOW) == 0.0


def test_names_are_compared_without_case():
    assert retry_after({"retry-after": "5"}, now=NOW) == 5.0
    assert retry_after({"RETRY-AFTER": "6"}, now=NOW) == 6.0
    assert retry_after({"x-ratelimit-reset": "7"}, now=NOW) == 7.0


def test_retry_after_wins_over_the_rate_limit_headers():
    headers = {"X-RateLimit-Reset": "30", "RateLimit-Reset": "20", "Retry-After": "10"}
    assert retry_after(headers, now=NOW) == 10.0


def test_ratelimit_reset_wins_over_x_ratelimit_reset():
    assert retry_after({"X-RateLimit-Reset": "30", "RateLimit-Reset": "20"}, now=NOW) == 20.0


def test_an_unparsable_retry_after_falls_through_to_the_next_header():
    headers = {"Retry-After": "soon", "RateLimit-Reset": "15"}
    assert retry_after(headers, now=NOW) == 15.0


def test_the_rate_limit_headers_are_seconds_only_not_dates():
    headers = {"RateLimit-Reset": http_date(NOW + timedelta(seconds=30))}
    assert retry_after(headers, 4.0, now=NOW) == 4.0


@pytest.mark.parametrize("value", ["-5", "1e3", "", "  ", "soon", "nan", "inf", "0x10", "+3"])
def test_a_value_that_is_not_delay_seconds_or_a_date_gives_the_default(value):
    assert retry_after({"Retry-After": value}, 60, now=NOW) == 60


def test_no_header_gives_the_default_or_none():
    assert retry_after({}, now=NOW) is None
    assert retry_after({"Content-Type": "text/plain"}, 2.5, now=NOW) == 2.5


def test_fractions_and_surrounding_space_are_accepted():
    assert retry_after({"Retry-After": " 1.5 "}, now=NOW) == 1.5


def test_bytes_and_numbers_as_values():
    """Raw ASGI-style headers carry bytes; a dict built by hand may carry a number."""
    assert retry_after({b"Retry-After": b"3"}, now=NOW) == 3.0
    assert retry_after({"Retry-After": 4}, now=NOW) == 4.0
    assert retry_after({"Retry-After": True}, 9, now=NOW) == 9


def test_aiohttp_headers_with_a_repeated_header_use_the_first_that_parses():
    headers = CIMultiDict()
    headers.add("Retry-After", "garbage")
    headers.add("retry-after", "12")
    assert retry_after(CIMultiDictProxy(headers), now=NOW) == 12.0


class MultiItems:
    """The shape of httpx's ``Headers``: ``items()`` joins repeats, ``multi_items()`` does not."""

    def __init__(self, pairs):
        self.pairs = pairs

    def items(self):
        raise AssertionError("multi_items() is preferred when a client has it")

    def multi_items(self):
        return list(self.pairs)


def test_httpx_style_headers_are_read_through_multi_items():
    assert retry_after(MultiItems([("retry-after", "x"), ("Retry-After", "8")]), now=NOW) == 8.0


def test_without_now_a_date_counts_from_the_current_time():
    seconds = retry_after({"Retry-After": http_date(datetime.now(UTC) + timedelta(hours=1))})
    assert 3590 <= seconds <= 3600


@pytest.mark.parametrize("headers", [None, "Retry-After: 5", b"x", 5, ["Retry-After"]])
def test_headers_that_are_not_a_mapping_are_refused(headers):
    with pytest.raises(TypeError, match="headers must be a mapping"):
        retry_after(headers)


@pytest.mark.parametrize("default", [-1, float("nan"), float("inf"), "60", True])
def test_a_default_that_is_not_seconds_is_refused(default):
    with pytest.raises(ValueError, match="default must be None or seconds >= 0"):
        retry_after({}, default)


def test_a_naive_now_is_refused():
    with pytest.raises(ValueError, match="now must be an aware datetime"):
        retry_after({"Retry-After": "5"}, now=datetime(2026, 12, 5))


# -- properties ---------------------------------------------------------------------

values = st.one_of(
    st.text(max_size=30),
    st.binary(max_size=30),
    st.integers(min_value=-(10**6), max_value=10**12),
    st.floats(),
    st.datetimes(timezones=st.just(UTC)).map(http_date),
    st.none(),
)
names = st.sampled_from(
    [*NAMES, *(n.lower() for n in NAMES), *(n.upper() for n in NAMES), "Content-Type"]
)


@given(st.dictionaries(names, values, max_size=6))
def test_the_answer_is_never_negative_and_never_raises_for_any_values(headers):
    seconds = retry_after(headers, now=NOW)
    assert seconds is None or seconds >= 0


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(NAMES), st.data())
def test_delay_seconds_read_back_exactly_under_any_spelling_of_the_name(seconds, name, data):
    spelled = "".join(data.draw(st.sampled_from([c.lower(), c.upper()])) for c in name)
    assert retry_after({spelled: str(seconds)}, now=NOW) == float(seconds)


@given(st.integers(min_value=-(10**7), max_value=10**8))
def test_an_http_date_gives_the_seconds_until_it_or_zero(offset):
    when = NOW + timedelta(seconds=offset)
    assert retry_after({"Retry-After": http_date(when)}, now=NOW) == float(max(offset, 0))


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=0, max_value=10**6),
)
def test_the_first_header_in_order_that_is_present_wins(first, second, third):
    headers = dict(zip(NAMES, map(str, (first, second, third)), strict=True))
    assert retry_after(headers, now=NOW) == float(first)
    del headers["Retry-After"]
    assert retry_after(headers, now=NOW) == float(second)
    del headers["RateLimit-Reset"]
    assert retry_after(headers, now=NOW) == float(third)
