"""Canary page writes without Streamlit: parsing, refusal with nothing written, the stale refusal."""

from __future__ import annotations

import math

import pytest

from app.dashboard import canary_form
from app.dashboard.identity import Identity
from core.faults import FaultSettings
from db.canary import audit_count, ensure_setting, get_guardrail, get_state, set_ratio
from db.faults import get_faults

ALICE = Identity("alice", "operator", "account")
VERA = Identity("vera", "viewer", "account")


@pytest.fixture
def eng(sqlite_url):
    from db.engine import dispose_all, get_engine

    e = get_engine(sqlite_url)
    ensure_setting(e, 0.1)
    yield e
    dispose_all()


@pytest.mark.parametrize(
    "value, ratio", [(0, 0.0), (100, 1.0), (25, 0.25), (12.5, 0.125), ("30", 0.3), (" 7.5 % ", 0.075), ("2,5", 0.025)]
)
def test_parse_percent_accepts_numbers_and_text(value, ratio):
    assert canary_form.parse_percent(value) == pytest.approx(ratio)


def test_minus_zero_is_zero_not_negative_zero():
    for typed in (-0.0, "-0", "-0.0 %"):
        assert math.copysign(1.0, canary_form.parse_percent(typed)) == 1.0


@pytest.mark.parametrize("value", [None, True, "", "abc", "12x", -0.1, 100.01, 150, math.nan, math.inf, [1]])
def test_parse_percent_refuses_with_a_message(value):
    with pytest.raises(ValueError, match="Canary ratio must be"):
        canary_form.parse_percent(value)


def test_apply_writes_and_audits(eng):
    seen = get_state(eng).version
    out = canary_form.apply_ratio(eng, 25, "  widen  ", expected_version=seen, actor=ALICE)
    assert out.ok and "25 %" in out.message
    state = get_state(eng)
    assert (state.ratio, state.updated_by, state.reason, state.version) == (0.25, "alice", "widen", seen + 1)
    assert audit_count(eng) == 1


@pytest.mark.parametrize(
    "percent, reason, needle",
    [
        (150, "why", "between 0 and 100"),
        ("abc", "why", "number"),
        (None, "why", "number"),
        (-1, "why", "between 0 and 100"),
        (20, "   ", "reason is required"),
        (20, "x" * 501, "too long"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(eng, percent, reason, needle):
    before = get_state(eng)
    out = canary_form.apply_ratio(eng, percent, reason, expected_version=before.version, actor=ALICE)
    assert not out.ok
    assert needle in out.message and "Nothing was written" in out.message
    assert get_state(eng) == before and audit_count(eng) == 0


def test_stale_version_is_refused_naming_who_changed_it_to_what(eng):
    seen = get_state(eng).version
    set_ratio(eng, 0.4, expected_version=seen, actor="bob", reason="other tab")
    out = canary_form.apply_ratio(eng, 90, "mine", expected_version=seen, actor=ALICE)
    assert not out.ok
    assert "bob" in out.message and "40 %" in out.message and "Nothing was written" in out.message
    assert out.state is not None and out.state.version == seen + 1  # the page re-locks on this
    assert get_state(eng).ratio == 0.4 and audit_count(eng) == 1


def test_guardrail_save_and_refusal(eng):
    out = canary_form.save_guardrail(eng, True, 30, 5, 10, actor=ALICE)
    assert out.ok
    g = get_guardrail(eng)
    assert (g.enabled, g.error_rate_threshold, g.window_minutes, g.min_requests, g.updated_by) == (
        True,
        0.3,
        5,
        10,
        "alice",
    )
    bad = canary_form.save_guardrail(eng, False, 0, 5, 10, actor=ALICE)
    assert not bad.ok and "above 0" in bad.message
    assert not canary_form.save_guardrail(eng, False, 30, 61, 10, actor=ALICE).ok
    assert not canary_form.save_guardrail(eng, False, 30, 5, 0, actor=ALICE).ok
    assert get_guardrail(eng).enabled is True  # nothing written by the refusals


def test_faults_save_keeps_other_fields_and_clear_removes_row(eng):
    base = FaultSettings(timeout_rate=0.1)
    out = canary_form.save_faults(eng, "holysheep", 50, 10, 2, actor=ALICE, base=base)
    assert out.ok
    f = get_faults(eng, "holysheep")
    assert (f.error_rate, f.rate_limit_rate, f.latency_multiplier, f.timeout_rate) == (0.5, 0.1, 2.0, 0.1)
    assert not canary_form.save_faults(eng, "holysheep", 120, 0, 1, actor=ALICE).ok
    assert not canary_form.save_faults(eng, "holysheep", 10, 0, 0, actor=ALICE).ok
    assert get_faults(eng, "holysheep").error_rate == 0.5
    assert canary_form.reset_faults(eng, "holysheep", actor=ALICE).ok
    assert get_faults(eng, "holysheep") is None


def test_what_the_page_inputs_and_guardrail_caption_show():
    from db.monitor import GuardrailReading

    assert canary_form.input_percent(0.125) == 12.5 and canary_form.input_percent(1 / 3) == 33.3
    faults = FaultSettings(error_rate=0.25, rate_limit_rate=0.5, latency_multiplier=3.0)
    assert canary_form.fault_inputs(faults) == (25.0, 50.0, 3.0)
    assert canary_form.guardrail_status(GuardrailReading(150, 3), 5) == "2.0 % of 150 attempts failed in the last 5 min"
    assert canary_form.guardrail_status(GuardrailReading(0, 0), 10) == "no attempts in the last 10 min"


@pytest.mark.parametrize("value", [150, -5, "nan", "1e400", "text", "150", "-5", math.nan, math.inf])
def test_out_of_range_or_unparsable_ratio_is_refused_next_to_the_field(eng, value):
    before = get_state(eng)
    out = canary_form.apply_ratio(eng, value, "operator typo", expected_version=before.version, actor=ALICE)
    assert not out.ok and out.field == "ratio"
    assert "Canary ratio must be" in out.message and "Nothing was written" in out.message
    assert get_state(eng) == before and audit_count(eng) == 0


def test_the_current_value_is_refused_as_no_change(eng):
    before = get_state(eng)
    out = canary_form.apply_ratio(eng, "10", "again", expected_version=before.version, actor=ALICE)
    assert not out.ok and out.field == "ratio" and "No change" in out.message and "10 %" in out.message
    assert get_state(eng) == before and audit_count(eng) == 0


def test_a_viewer_is_refused_by_every_write(eng):
    before, g = get_state(eng), get_guardrail(eng)
    outs = [
        canary_form.apply_ratio(eng, 50, "why", expected_version=before.version, actor=VERA),
        canary_form.save_guardrail(eng, True, 30, 5, 10, actor=VERA),
        canary_form.save_faults(eng, "holysheep", 50, 0, 1, actor=VERA),
        canary_form.reset_faults(eng, "holysheep", actor=VERA),
    ]
    assert all(not o.ok and "viewer" in o.message and "vera" in o.message for o in outs)
    assert get_state(eng) == before and audit_count(eng) == 0
    assert get_guardrail(eng) == g and get_faults(eng, "holysheep") is None


@pytest.mark.parametrize(
    "args, field",
    [
        (("0", "5", "10"), "threshold"),
        (("150", "5", "10"), "threshold"),
        (("abc", "5", "10"), "threshold"),
        (("30", "0", "10"), "window"),
        (("30", "2.5", "10"), "window"),
        (("30", "5", "x"), "min_requests"),
    ],
)
def test_guardrail_refusals_name_their_field(eng, args, field):
    before = get_guardrail(eng)
    out = canary_form.save_guardrail(eng, True, *args, actor=ALICE)
    assert not out.ok and out.field == field and "Nothing was written" in out.message
    assert get_guardrail(eng) == before


def test_unchanged_guardrail_and_faults_are_refused_as_no_change(eng):
    assert canary_form.save_guardrail(eng, True, "30", "5", "10", actor=ALICE).ok
    stored = get_guardrail(eng)
    again = canary_form.save_guardrail(eng, True, "30", "5", "10", actor=ALICE)
    assert not again.ok and "No change" in again.message and get_guardrail(eng) == stored
    assert canary_form.save_faults(eng, "holysheep", "50", "0", "2", actor=ALICE).ok
    again = canary_form.save_faults(eng, "holysheep", "50", "0", "2", actor=ALICE)
    assert not again.ok and "No change" in again.message


@pytest.mark.parametrize(
    "args, field",
    [
        (("150", "0", "1"), "error_rate"),
        (("10", "-1", "1"), "rate_limit_rate"),
        (("10", "0", "0"), "latency_multiplier"),
        (("10", "0", "nan"), "latency_multiplier"),
        (("10", "0", "fast"), "latency_multiplier"),
    ],
)
def test_fault_refusals_name_their_field(eng, args, field):
    out = canary_form.save_faults(eng, "holysheep", *args, actor=ALICE)
    assert not out.ok and out.field == field and "Nothing was written" in out.message
    assert get_faults(eng, "holysheep") is None


# -- answer-quality faults ---------------------------------------------------------------------------


def test_quality_faults_are_parsed_with_their_bounds_and_shown_back() -> None:
    from app.dashboard.canary_form import FieldError, parse_faults, quality_faults_text, quality_inputs

    f = parse_faults(
        "0", "0", "1", quality={"refusal_rate": "3 %", "verbosity_multiplier": "x2", "ttft_multiplier": 1.5}
    )
    assert (f.refusal_rate, f.verbosity_multiplier, f.ttft_multiplier) == (0.03, 2.0, 1.5)
    assert quality_inputs(f)["refusal_rate"] == 3.0 and quality_inputs(f)["verbosity_multiplier"] == 2.0
    assert quality_faults_text(f) == "3 % refusals, verbosity x2, TTFT x1.5"
    for field, bad in [("refusal_rate", "nan"), ("empty_rate", "101"), ("verbosity_multiplier", "0.5"),
                       ("ttft_multiplier", "1e400"), ("schema_violation_rate", True)]:  # fmt: skip
        with pytest.raises(FieldError) as info:
            parse_faults("0", "0", "1", quality={field: bad})
        assert info.value.field == field
