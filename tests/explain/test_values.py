import itertools
from fractions import Fraction

import pytest

from agent.explain.values import (
    ValueParseError,
    format_quantity,
    parse_quantity,
    parse_semver,
)


@pytest.mark.parametrize(("text", "value"), [
    ("80Gi", 80 * 2**30), ("1024Mi", 2**30), ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)),
    ("2k", 2000), ("1e3", 1000), ("1E-3", Fraction(1, 1000)), (".5", Fraction(1, 2)), (7, 7),
    ("9728Mi", 9728 * 2**20), ("-1", -1),
])
def test_quantities_parse_exactly(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "Gi", "1.2.3", "1 Gi", "1gi", "abc", True, None])
def test_bad_quantities_are_rejected(bad):
    with pytest.raises(ValueParseError):
        parse_quantity(bad)


def test_format_prefers_binary_suffixes_and_round_trips():
    for text in ("80Gi", "9728Mi", "3", "500m", "1Ki"):
        assert parse_quantity(format_quantity(parse_quantity(text))) == parse_quantity(text)
    assert format_quantity(parse_quantity("81920Mi")) == "80Gi"


def test_semver_precedence_follows_the_spec():
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
             "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.2.0", "10.0.0"]
    parsed = [parse_semver(v) for v in order]
    for a, b in itertools.pairwise(parsed):
        assert a.compare(b) == -1 and b.compare(a) == 1
    assert parse_semver("1.2.3+build.5").compare(parse_semver("1.2.3")) == 0


def test_semver_normalize_accepts_short_forms():
    assert str(parse_semver("v550.54", normalize=True)) == "550.54.0"
    with pytest.raises(ValueParseError):
        parse_semver("550.54")
    with pytest.raises(ValueParseError):
        parse_semver("01.2.3")


@pytest.mark.parametrize("bad", ["1.2.3\n", "1\u0661.2.3", "1.2.3-rc.1\n"])
def test_semver_is_matched_whole_and_ascii(bad):
    # re.match with "$" accepted a trailing newline; \d without re.ASCII, any Unicode digit.
    with pytest.raises(ValueParseError):
        parse_semver(bad)
