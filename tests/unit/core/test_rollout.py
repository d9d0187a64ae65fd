"""A rollout plan from the operator's values: every bad number refused with a line naming it."""

from __future__ import annotations

import pytest

from core.rollout import DEFAULT_STEPS, Plan, RolloutState, check_plan, parse_steps


def test_the_defaults() -> None:
    plan = check_plan(candidate="holysheep")
    assert plan == Plan(candidate="holysheep")
    assert plan.steps == DEFAULT_STEPS == (1, 5, 10, 25, 50, 100)
    assert (plan.bake_s, plan.min_samples, plan.alpha, plan.dry_run) == (600, 50, 0.05, False)


@pytest.mark.parametrize(
    ("raw", "steps"),
    [("1,5,25,100", (1, 5, 25, 100)), (" 0.5 , 2 ", (0.5, 2)), ([10, "50"], (10, 50)), ("100", (100,))],
)
def test_steps(raw, steps) -> None:
    assert parse_steps(raw) == steps


@pytest.mark.parametrize(
    "raw", ["", "5,5", "10,5", "0", "-1", "101", "nan", "inf", "1e400", "1e-400", "0x10", "1,,5", ",".join(["1"] * 21)]
)
def test_bad_steps_are_refused(raw) -> None:
    with pytest.raises(ValueError):
        parse_steps(raw)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"candidate": " "},
        {"bake_s": "nan"},
        {"bake_s": 0.5},
        {"bake_s": "1e400"},
        {"min_samples": "5.5"},
        {"min_samples": 0},
        {"alpha": 0},
        {"alpha": "0.6"},
        {"alpha": True},
        {"shadow_share": "0.05"},
        {"shadow_share": 2, "shadow_budget_usd": 1},
        {"shadow_share": 0.1, "shadow_budget_usd": "nan"},
    ],
)
def test_bad_values_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        check_plan(**{"candidate": "holysheep", **kwargs})


def test_a_state_knows_its_weight_and_serialises() -> None:
    plan = check_plan(candidate="holysheep", steps="1,25")
    r = RolloutState(1, "global", plan, "paused", 1, 0.0, 0.0, "op", "why", 0.0, "", 2)
    assert (r.weight, r.active, r.last_step) == (0.25, True, True)
    assert r.to_dict()["plan"]["steps"] == [1, 25] and r.to_dict()["weight"] == 0.25
