"""core.bounds: numbers from config, CLI, URL or form refused before any arithmetic when they cannot work."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.bounds import MAX_TEXT, BoundsError, parse_decimal, parse_float, parse_int


def test_the_issue_message_shape():
    with pytest.raises(BoundsError) as e:
        parse_float("1e400", field="utilization", lo=0.1, hi=1)
    assert str(e.value) == "utilization must be a number from 0.1 to 1, got '1e400'"
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    assert e.value.field == "utilization"


# The cases issue 7 reproduced, each with the bounds its field would use.
def test_latency_scale_1e300_is_refused():
    with pytest.raises(BoundsError, match=r"latency_scale must be a number from 0 to 1000, got 1e\+300"):
        parse_float(1e300, field="latency_scale", lo=0, hi=1000)


def test_flush_interval_inf_is_refused_from_toml_and_text():
    for raw in (math.inf, "inf", "Infinity", " INF "):
        with pytest.raises(BoundsError, match="flush_interval_s must be a number above 0 and at most 60"):
            parse_float(raw, field="flush_interval_s", lo=0, hi=60, lo_open=True)


def test_canary_1e_minus_400_underflow_is_refused_not_set_to_zero():
    with pytest.raises(BoundsError, match=r"ratio must be a number from 0 to 1, got '1e-400'"):
        parse_float("1e-400", field="ratio", lo=0, hi=1)
    with pytest.raises(BoundsError):
        parse_decimal("1e-400", field="ratio", lo=0, hi=1)
    # A zero spelled with an exponent is still zero, not an underflow.
    assert parse_float("0e-400", field="ratio", lo=0, hi=1) == 0.0
    assert parse_float("0.000", field="ratio", lo=0, hi=1) == 0.0


def test_prune_days_nan_is_refused():
    for raw in ("nan", "NaN", math.nan, "-nan"):
        with pytest.raises(BoundsError, match="days must be a whole number from 1 to 3650"):
            parse_int(raw, field="days", lo=1, hi=3650)


def test_huge_exponent_text_is_refused_by_shape_without_arithmetic():
    # float('1e100000000') is inf (cheap); Fraction('1e100000000') would build a 100-million-digit int.
    for raw in ("1e100000000", "1e-100000000", "9" * 5000):
        with pytest.raises(BoundsError, match="utilization"):
            parse_float(raw, field="utilization", lo=0.1, hi=1)
        with pytest.raises(BoundsError, match="utilization"):
            parse_decimal(raw, field="utilization", lo=Decimal("0.1"), hi=1)
    with pytest.raises(BoundsError):
        parse_int("9" * 5000, field="n", lo=0)


def test_long_text_is_shown_truncated():
    with pytest.raises(BoundsError) as e:
        parse_float("1" * 200, field="x", lo=0, hi=1)
    assert len(str(e.value)) < 120 and str(e.value).endswith("\u2026'")


@pytest.mark.parametrize("raw", [True, False, "", "   ", "abc", "0x10", "1_000", "1,5", "--1", "1e", ".", None, [1]])
def test_non_numbers_are_refused(raw):
    with pytest.raises(BoundsError):
        parse_float(raw, field="x", lo=-10, hi=10)
    with pytest.raises(BoundsError):
        parse_decimal(raw, field="x", lo=-10, hi=10)


def test_valid_spellings_are_accepted():
    assert parse_float(" 0.5 ", field="x", lo=0, hi=1) == 0.5
    assert parse_float("5e-1", field="x", lo=0, hi=1) == 0.5
    assert parse_float(".25", field="x", lo=0, hi=1) == 0.25
    assert parse_float(1, field="x", lo=0, hi=1) == 1.0
    assert parse_float("-3", field="x") == -3.0
    assert parse_int(" 7 ", field="n", lo=1, hi=10) == 7 and parse_int(7.0, field="n", lo=1, hi=10) == 7
    assert parse_decimal("0.125", field="r", lo=0, hi=1) == Decimal("0.125")
    assert parse_decimal(0.1, field="r", lo=0, hi=1) == Decimal("0.1")


def test_open_and_one_sided_bounds():
    assert parse_float("1", field="x", lo=0, hi=1, lo_open=True) == 1.0
    with pytest.raises(BoundsError, match="above 0 and at most 1"):
        parse_float("0", field="x", lo=0, hi=1, lo_open=True)
    with pytest.raises(BoundsError, match="at least 0 and below 1"):
        parse_float("1", field="x", lo=0, hi=1, hi_open=True)
    with pytest.raises(BoundsError, match="a number at least 0, got"):
        parse_float("-1", field="x", lo=0)
    with pytest.raises(BoundsError, match="a whole number at most 5"):
        parse_int(6, field="n", hi=5)
    with pytest.raises(BoundsError, match="a finite number"):
        parse_float(10**400, field="x")


def test_int_fields_refuse_fractions_and_exponents():
    for raw in ("1.5", 1.5, "1e3", math.inf):
        with pytest.raises(BoundsError):
            parse_int(raw, field="n", lo=0, hi=10**6)


def test_decimal_places_limit():
    assert parse_decimal("0.2500", field="r", lo=0, hi=1, max_places=2) == Decimal("0.25")
    with pytest.raises(BoundsError, match=r"at most 2 decimal places, got '0\.125'"):
        parse_decimal("0.125", field="r", lo=0, hi=1, max_places=2)


@given(st.text(max_size=80))
def test_any_text_is_either_a_bounded_finite_float_or_a_bounds_error(raw):
    try:
        value = parse_float(raw, field="x", lo=-1e6, hi=1e6)
    except BoundsError as e:
        assert str(e).startswith("x must be a number from -1000000 to 1000000, got ")
    else:
        assert math.isfinite(value) and -1e6 <= value <= 1e6


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_is_accepted_exactly_when_finite_and_in_range(raw):
    ok = math.isfinite(raw) and 0 <= raw <= 1
    try:
        assert parse_float(raw, field="x", lo=0, hi=1) == raw and ok
    except BoundsError:
        assert not ok


@given(st.floats(min_value=0, max_value=1))
def test_text_of_an_in_range_float_round_trips(x):
    assert parse_float(repr(x), field="x", lo=0, hi=1) == x
    assert float(parse_decimal(repr(x), field="x", lo=0, hi=1)) == x


@given(st.integers())
def test_any_int_is_accepted_exactly_when_in_range(n):
    try:
        assert parse_int(n, field="n", lo=-100, hi=100) == n and -100 <= n <= 100
    except BoundsError:
        assert not -100 <= n <= 100
    if len(str(n)) <= MAX_TEXT:
        try:
            assert parse_int(str(n), field="n", lo=-100, hi=100) == n
        except BoundsError:
            assert not -100 <= n <= 100
