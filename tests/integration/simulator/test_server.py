"""The simulator's statistics at volume: fault rates and latency jitter over thousands of draws."""

from __future__ import annotations

from app.simulator.profiles import LatencyProfile
from core.faults import FaultSettings
from tests.unit.simulator.test_server import fault_outcomes, recorded_sleeps


def test_fault_rates_are_statistically_near_their_setting() -> None:
    n = 2000
    outcomes = fault_outcomes(FaultSettings(timeout_rate=0.1, rate_limit_rate=0.2, error_rate=0.25), n, seed=3)
    # Faults are drawn independently in order timeout, 429, 500: each applies to what is left.
    expected = {"timeout": 0.1, 429: 0.9 * 0.2, 500: 0.9 * 0.8 * 0.25}
    for outcome, share in expected.items():
        sigma = (share * (1 - share) / n) ** 0.5
        assert abs(outcomes[outcome] / n - share) < 4 * sigma, outcomes
    assert sum(outcomes.values()) == n


def test_jitter_stays_within_its_band_and_uses_the_model_profile() -> None:
    profiles = {
        "default": LatencyProfile(ttft_ms=999, tokens_per_s=1, jitter=0.0),
        "gpt-4.1": LatencyProfile(ttft_ms=100, tokens_per_s=1000, jitter=0.5),
    }
    firsts = [recorded_sleeps(1.0, stream=True, profiles=profiles)[0][0] for _ in range(20)]
    assert all(0.05 <= s <= 0.15 for s in firsts)
    assert len(set(firsts)) == 1  # same seed, same draw
