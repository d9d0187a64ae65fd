"""Circuit breaker state machine, driven by an explicit clock."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.routing.breaker import BreakerPolicy, CircuitBreaker

POLICY = BreakerPolicy(window_s=10, min_attempts=4, failure_rate=0.5, cooldown_s=5.0)


def fail(b: CircuitBreaker, n: int, now: float) -> None:
    for _ in range(n):
        b.record(False, now)


def test_opens_at_the_failure_rate_with_enough_attempts_only():
    b = CircuitBreaker("p", POLICY)
    fail(b, 3, 0.0)
    assert b.state == "closed"  # 100 % failures, but 3 < min_attempts
    assert b.allow(0.0)
    b.record(True, 0.0)
    assert b.state == "open"  # 3 of 4 attempts failed: 75 % >= 50 %


def test_three_of_four_failures_open_it():
    b = CircuitBreaker("p", POLICY)
    b.record(True, 0.0)
    fail(b, 3, 0.0)
    assert b.state == "open"
    assert not b.allow(1.0)


def test_below_the_rate_stays_closed():
    b = CircuitBreaker("p", POLICY)
    for _ in range(4):
        b.record(True, 0.0)
    fail(b, 3, 0.0)  # 3 of 7 < 50 %
    assert b.state == "closed"
    assert b.allow(0.0)


def test_old_failures_leave_the_window():
    b = CircuitBreaker("p", POLICY)
    fail(b, 3, 0.0)
    b.record(True, 20.0)  # the three failures are 20 s old: outside the 10 s window
    fail(b, 1, 20.0)
    assert b.state == "closed"
    assert b.snapshot(20.0).attempts == 2


def test_half_open_lets_exactly_one_probe_through_and_success_closes():
    changes: list[tuple[str, str, str]] = []
    b = CircuitBreaker("p", POLICY, on_change=lambda n, old, new, why: changes.append((n, old, new)))
    fail(b, 4, 0.0)
    assert not b.allow(4.9)
    assert b.allow(5.0)  # the probe
    assert b.state == "half_open"
    assert not b.allow(5.1)  # everyone else still waits
    b.record(True, 5.2)
    assert b.state == "closed"
    assert b.allow(5.3)
    assert changes == [("p", "closed", "open"), ("p", "open", "half_open"), ("p", "half_open", "closed")]
    assert b.snapshot(5.3).attempts == 0  # a fresh window after closing


def test_failed_probe_reopens_for_another_cooldown():
    b = CircuitBreaker("p", POLICY)
    fail(b, 4, 0.0)
    assert b.allow(5.0)
    b.record(False, 5.5)
    assert b.state == "open"
    assert not b.allow(10.0)
    assert b.snapshot(10.0).retry_at == pytest.approx(10.5)
    assert b.allow(10.5)


def test_a_lost_probe_is_replaced_after_a_cooldown():
    b = CircuitBreaker("p", POLICY)
    fail(b, 4, 0.0)
    assert b.allow(5.0)  # probe handed out, its caller never reports
    assert not b.allow(9.0)
    assert b.allow(10.0)


def test_disabled_breaker_always_allows():
    b = CircuitBreaker("p", BreakerPolicy(enabled=False))
    fail(b, 100, 0.0)
    assert b.allow(0.0)
    assert b.state == "closed"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window_s": 0},
        {"min_attempts": 0},
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"failure_rate": float("nan")},
        {"cooldown_s": float("inf")},
        {"cooldown_s": 0.0},
    ],
)
def test_policy_bounds(kwargs):
    with pytest.raises(ValueError, match="breaker"):
        BreakerPolicy(**kwargs)


@given(st.lists(st.tuples(st.booleans(), st.floats(min_value=0, max_value=0.5)), max_size=200))
def test_only_one_probe_in_flight_and_state_is_valid(events):
    b = CircuitBreaker("p", POLICY)
    now = 0.0
    for ok, dt in events:
        now += dt
        if b.allow(now):
            b.record(ok, now)
        assert b.state in ("closed", "open", "half_open")
        if b.state == "half_open":
            assert not b.allow(now)  # a second caller at the same moment is refused


def test_concurrent_callers_get_one_probe():
    b = CircuitBreaker("p", POLICY)
    fail(b, 4, 0.0)
    allowed: list[bool] = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        allowed.append(b.allow(6.0))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert allowed.count(True) == 1
