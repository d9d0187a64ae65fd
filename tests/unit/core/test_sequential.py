"""The anytime-valid rate-ratio test (core/sequential.py): its statistic against the closed form,
what it concludes on clear evidence, what it never concludes on none, and its refusals. Its
guarantee (false alarms at most alpha however often it is read) is checked by simulation in
``benchmarks/rollouts_bench.py``; a small seeded version runs here."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from core.sequential import RateRatioTest


def test_the_statistic_is_the_mixture_of_binomial_likelihood_ratios():
    t = RateRatioTest(theta0=1.0, alpha=0.05, factors=(2.0,))
    w = 0.25
    for arm in (True, False, False, True, False):
        t.observe(arm, w)
    q0, q1 = w, 2 * w / (2 * w + 1 - w)
    expected = (q1 / q0) ** 2 * ((1 - q1) / (1 - q0)) ** 3
    assert t.lr == pytest.approx(expected) and t.events == 5 and t.candidate_events == 2


def test_no_events_or_uninformative_shares_conclude_nothing():
    t = RateRatioTest()
    assert (t.lr, t.p_value, t.rejected) == (1.0, 1.0, False)
    for share in (0.0, 1.0, float("nan"), -1.0, 2.0):
        t.observe(True, share)
    assert t.events == 0 and t.p_value == 1.0


def test_a_candidate_with_most_of_the_events_at_a_small_share_is_rejected():
    t = RateRatioTest(alpha=0.05)
    for _ in range(12):
        t.observe(True, 0.05)
    assert t.rejected and t.p_value < 0.001


def test_a_candidate_with_its_share_of_events_is_not():
    t = RateRatioTest(alpha=0.05)
    rng = random.Random(4)
    for _ in range(2000):
        t.observe(rng.random() < 0.1, 0.1)  # events in proportion to traffic: the null's edge
    assert not t.rejected and t.p_value > 0.05


def test_the_allowed_increase_moves_the_null():
    strict, lenient = RateRatioTest(theta0=1.0), RateRatioTest(theta0=2.0)
    rng = random.Random(9)
    for _ in range(400):  # the candidate at 1.8x the baseline's rate, at a 20 % share
        share = 0.2
        arm = rng.random() < share * 1.8 / (share * 1.8 + 1 - share)
        strict.observe(arm, share)
        lenient.observe(arm, share)
    assert strict.rejected and not lenient.rejected


def test_the_p_value_is_always_valid_it_never_rises_back():
    t = RateRatioTest()
    seen = []
    for arm in [True] * 5 + [False] * 200:
        t.observe(arm, 0.1)
        seen.append(t.p_value)
    assert all(b <= a for a, b in itertools.pairwise(seen))


@pytest.mark.parametrize(
    "kw",
    [{"theta0": 0}, {"theta0": math.inf}, {"alpha": 0}, {"alpha": 1}, {"factors": ()}, {"factors": (1.0,)}],
)
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        RateRatioTest(**kw)


def test_false_alarms_stay_under_alpha_on_a_small_seeded_simulation():
    """500 healthy candidates, read after every event, through steps of growing weight."""
    alarms = 0
    for seed in range(500):
        rng = random.Random(seed)
        t = RateRatioTest(alpha=0.05)
        for share in (0.01, 0.05, 0.1, 0.25, 0.5):
            for _ in range(60):  # events per step
                t.observe(rng.random() < share, share)
        alarms += t.rejected
    assert alarms / 500 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 500)  # alpha, with three standard errors of slack


def test_the_observed_ratio():
    t = RateRatioTest()
    for arm in [True] * 3 + [False] * 9:
        t.observe(arm, 0.25)
    assert t.estimate((100, 300)) == pytest.approx((3 / 100) / (9 / 300))
    assert RateRatioTest().estimate((0, 10)) is None


def test_units_whose_chance_of_the_event_does_not_depend_on_the_arm_are_not_rejected():
    # Units of very different chances of the event (most sessions clean, a few failing throughout),
    # each on the candidate with its own known probability: the null's edge, P_c = P_b per unit.
    rng = random.Random(11)
    t = RateRatioTest(alpha=0.05)
    for _ in range(5000):
        share = rng.choice((0.01, 0.05, 0.25, 0.5))
        chance = 0.9 if rng.random() < 0.05 else 0.02
        if rng.random() < chance:
            t.observe(rng.random() < share, share)
    assert not t.rejected and t.events > 200


def test_the_streamed_shadow_simulation_finds_a_late_first_token_and_passes_the_allowed_change():
    """The benchmark's streamed shadow phase, small and seeded: a first token twice as late is found
    worse well within a phase's pairs, one within the allowed change (+10 %) is not."""
    from benchmarks.rollouts_bench import PAIRS, shadow_ttft

    late = [shadow_ttft(2.0, seed) for seed in range(5)]
    assert all(n is not None and n < PAIRS for n in late)
    assert [shadow_ttft(mult, seed) for mult in (1.0, 1.1) for seed in range(10)] == [None] * 20
