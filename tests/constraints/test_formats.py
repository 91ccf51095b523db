"""The format regexes match exactly the valid values (dates checked against the calendar, leap years included) and
never a character that would need escaping inside a JSON string."""

import datetime
import itertools
import re

import pytest

from diffusiongemma.constraints.formats import DATE, DATE_TIME, EMAIL, FORMAT_REGEX, TIME, URI


def is_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("year", ["0001", "0004", "0100", "0400", "1900", "2000", "2023", "2024", "9999", "0000"])
def test_date_is_the_calendar(year):
    for month, day in itertools.product(range(0, 14), range(0, 33)):
        text = f"{year}-{month:02d}-{day:02d}"
        assert bool(re.fullmatch(DATE, text)) == is_date(text), text


@pytest.mark.parametrize("text, valid", [
    ("2024-02-29T23:59:59Z", True), ("2023-02-29T00:00:00Z", False), ("2023-01-01T10:00:00", False),  # RFC 3339
    ("2023-01-01T10:00:00.123+05:30", True), ("2023-01-01T24:00:00Z", False), ("2023-01-01t10:00:00Z", False),
])
def test_date_time_is_rfc3339_with_an_offset(text, valid):
    assert bool(re.fullmatch(DATE_TIME, text)) == valid
    if valid:
        datetime.datetime.fromisoformat(text)


def test_time_requires_an_offset():
    assert re.fullmatch(TIME, "10:00:00Z") and re.fullmatch(TIME, "10:00:00.5-01:00")
    assert not re.fullmatch(TIME, "10:00:00") and not re.fullmatch(TIME, "10:60:00Z")


def test_email_and_uri():
    assert re.fullmatch(EMAIL, "a.b+c@example.co.uk") and not re.fullmatch(EMAIL, ".a@example.com")
    assert not re.fullmatch(EMAIL, "a@b")  # a domain has a dot
    assert re.fullmatch(URI, "https://example.com:8080/a/b?x=1&y=%20#top")
    assert not re.fullmatch(URI, "https://exa mple.com")


@pytest.mark.parametrize("name", sorted(FORMAT_REGEX))
def test_no_format_can_write_a_character_json_must_escape(name):
    pattern = re.compile(FORMAT_REGEX[name])
    for c in ['"', "\\", "\n", "\x00", "\x1f", " "]:
        # the character cannot appear anywhere in a match: no match spans it
        probe = {"email": f"a{c}b@example.com", "date": f"2023-01-0{c}1", "time": f"10:00:0{c}0Z",
                 "date-time": f"2023-01-01T10:00:0{c}0Z", "uuid": f"0000000{c}-0000-0000-0000-000000000000",
                 "uri": f"https://example.com/a{c}b"}[name]
        assert not pattern.fullmatch(probe), (name, c)
