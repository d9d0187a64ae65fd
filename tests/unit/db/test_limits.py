"""Per-key rate limits and budgets (db/limits.py) on SQLite and PostgreSQL, including real contention:
threads in one process and two separate OS processes racing for one key's last slots."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from db.keys import create_key
from db.limits import (
    BUDGET_EXCEEDED,
    BUDGET_RESERVED,
    RATE_LIMITED,
    TOKENS_LIMITED,
    admit,
    period_start,
    prune,
    settle,
    settle_stale,
    spend,
    window_first_bucket,
    window_start,
    window_usage,
)

T0 = 1_790_000_040.0  # a whole minute (epoch seconds divisible by 60)
assert T0 % 60 == 0


def test_window_and_period_starts():
    assert window_start(T0 + 59.9) == T0 + 59 and window_start(T0 + 60) == T0 + 60  # one-second buckets
    assert window_first_bucket(T0 + 60.5) == T0  # every bucket overlapping the last 60 s
    assert period_start("day", T0) == int(T0 // 86400) * 86400
    ts = datetime(2026, 3, 17, 13, 5, tzinfo=UTC).timestamp()
    assert period_start("month", ts) == datetime(2026, 3, 1, tzinfo=UTC).timestamp()
    with pytest.raises(ValueError):
        period_start("week", ts)


def test_rpm_sliding_window_with_retry_after(engine):
    key, _ = create_key(engine, "k", rpm=3)
    got = [admit(engine, key, now=T0 + 10) for _ in range(4)]
    assert [d.allowed for d in got] == [True, True, True, False]
    assert [d.requests_in_window for d in got[:3]] == [1, 2, 3]
    refused = got[3]
    # The three requests of second T0+10 stop counting at T0+71 (the window covers 61 buckets).
    assert refused.code == RATE_LIMITED and refused.retry_after_s == 61 and refused.reservation_id is None
    assert "3 requests per minute" in refused.message
    assert not admit(engine, key, now=T0 + 60).allowed  # a new minute does not reset a sliding window
    assert admit(engine, key, now=T0 + 70.5).retry_after_s == 1  # never 0: the client must wait
    assert admit(engine, key, now=T0 + 71).allowed
    assert window_usage(engine, key, now=T0 + 10) == (3, 0)


def test_tpm_never_above_the_limit_in_a_window(engine):
    key, _ = create_key(engine, "tw", tpm=100)
    assert admit(engine, key, est_tokens=60, now=T0 + 50).allowed
    assert not admit(engine, key, est_tokens=60, now=T0 + 61).allowed  # 120 > 100 in the window
    d = admit(engine, key, est_tokens=40, now=T0 + 61)
    assert d.allowed  # exactly 100
    late = admit(engine, key, est_tokens=60, now=T0 + 100)
    assert not late.allowed and late.retry_after_s == 11  # the 60 of T0+50 count until T0+111
    assert admit(engine, key, est_tokens=60, now=T0 + 111).allowed
    huge = admit(engine, key, est_tokens=101, now=T0 + 500)
    assert not huge.allowed and "more than this key's limit" in huge.message


def test_key_without_limits_is_always_admitted(engine):
    key, _ = create_key(engine, "free")
    assert all(admit(engine, key, est_tokens=10**6, now=T0).allowed for _ in range(5))
    assert window_usage(engine, key, now=T0) == (5, 5 * 10**6)


def test_tpm_counts_estimates_then_real_tokens(engine):
    key, _ = create_key(engine, "t", tpm=100)
    d1 = admit(engine, key, est_tokens=50, now=T0)
    assert d1.allowed
    d2 = admit(engine, key, est_tokens=50, now=T0 + 1)  # 100: at the limit, not above it
    assert d2.allowed
    d3 = admit(engine, key, est_tokens=1, now=T0 + 2)
    assert not d3.allowed and d3.code == TOKENS_LIMITED and d3.retry_after_s == 59
    # The real counts were smaller: settling frees the window.
    assert settle(engine, d1.reservation_id, tokens=10, cost_usd=0, now=T0 + 3)
    assert settle(engine, d2.reservation_id, tokens=10, cost_usd=0, now=T0 + 3)
    assert window_usage(engine, key, now=T0 + 3) == (2, 20)
    assert admit(engine, key, est_tokens=1, now=T0 + 4).allowed


def test_budget_reserve_settle_exactly_once(engine):
    key, _ = create_key(engine, "b", budget_usd=1.0, period="day")
    d1 = admit(engine, key, est_cost_usd=0.6, now=T0)
    assert d1.allowed
    s = spend(engine, key, now=T0)
    assert (s.spent_micro_usd, s.reserved_micro_usd, s.budget_micro_usd) == (0, 600_000, 1_000_000)
    # 0.6 reserved + 0.6 more would exceed 1.0: refused (retry: it fits once the first settles
    # at less than 0.4), and the refusal used no rate slot.
    d2 = admit(engine, key, est_cost_usd=0.6, now=T0)
    assert not d2.allowed and d2.code == BUDGET_RESERVED and d2.retry_after_s == 1
    assert "daily budget of $1.00 is reserved by its requests in flight" in d2.message
    assert window_usage(engine, key, now=T0) == (1, 0)
    # Settle the real cost; a second settle of the same reservation changes nothing.
    assert settle(engine, d1.reservation_id, tokens=5, cost_usd=0.25, now=T0 + 1) is True
    assert settle(engine, d1.reservation_id, tokens=5, cost_usd=0.25, now=T0 + 2) is False
    assert settle(engine, "no-such-id", tokens=0, cost_usd=0, now=T0) is False
    s = spend(engine, key, now=T0)
    assert (s.spent_micro_usd, s.reserved_micro_usd) == (250_000, 0)
    assert s.spent_usd == 0.25 and s.used_ratio == 0.25
    assert admit(engine, key, est_cost_usd=0.6, now=T0 + 5).allowed


def test_budget_holds_the_ceiling_as_far_as_it_has_room_so_overspend_is_one_request(engine):
    """Issue 18 item 7: each request reserves its own worst case (must fit) and holds up to its
    model's worst case (as far as the budget has room); an upstream billing 50x what was asked
    overspends by at most the one request that held less than its ceiling."""
    key, _ = create_key(engine, "hold", budget_usd=1.0, period="day")
    big = admit(engine, key, est_cost_usd=0.01, ceiling_cost_usd=0.3, now=T0)
    assert big.allowed and big.reserved_micro_usd == 300_000  # room enough: the whole ceiling
    assert admit(engine, key, est_cost_usd=0.01, ceiling_cost_usd=0.3, now=T0).reserved_micro_usd == 300_000
    capped = admit(engine, key, est_cost_usd=0.01, ceiling_cost_usd=0.6, now=T0)
    assert capped.allowed and capped.reserved_micro_usd == 400_000  # only what was left
    assert spend(engine, key, now=T0).reserved_micro_usd == 1_000_000
    held = admit(engine, key, est_cost_usd=0.000001, ceiling_cost_usd=0.3, now=T0)
    assert held.code == BUDGET_RESERVED  # nothing admitted while the budget is held
    # Two settle at 50x their own estimate (0.5 USD each): the budget is spent, nothing more is admitted.
    for d in (big, capped):
        assert settle(engine, d.reservation_id, tokens=0, cost_usd=0.5, now=T0 + 1)
    assert admit(engine, key, est_cost_usd=0.01, now=T0 + 1).code == BUDGET_EXCEEDED  # 1.0 spent
    s = spend(engine, key, now=T0 + 1)
    assert (s.spent_micro_usd, s.reserved_micro_usd) == (1_000_000, 300_000)


def test_budget_used_up_exactly_refuses_even_zero_estimates(engine):
    key, _ = create_key(engine, "z", budget_usd=0.5, period="month")
    d = admit(engine, key, est_cost_usd=0.1, now=T0)
    settle(engine, d.reservation_id, tokens=0, cost_usd=0.5, now=T0)
    refused = admit(engine, key, est_cost_usd=0.0, now=T0 + 1)
    assert not refused.allowed and refused.code == BUDGET_EXCEEDED and "monthly" in refused.message
    # An estimate larger than the whole budget is refused outright.
    key2, _ = create_key(engine, "z2", budget_usd=0.5, period="day")
    assert admit(engine, key2, est_cost_usd=0.51, now=T0).code == BUDGET_EXCEEDED


def test_budget_resets_with_the_period(engine):
    key, _ = create_key(engine, "d", budget_usd=0.1, period="day")
    d = admit(engine, key, est_cost_usd=0.1, now=T0)
    settle(engine, d.reservation_id, tokens=0, cost_usd=0.1, now=T0)
    assert admit(engine, key, now=T0 + 1).code == BUDGET_EXCEEDED
    next_day = period_start("day", T0) + 86400
    assert admit(engine, key, now=next_day).allowed


def test_settle_stale_charges_the_estimate_and_prune_cleans_up(engine):
    key, _ = create_key(engine, "s", budget_usd=1.0, period="day", tpm=1000)
    admit(engine, key, est_tokens=50, est_cost_usd=0.2, now=T0)
    fresh = admit(engine, key, est_tokens=50, est_cost_usd=0.2, now=T0 + 50)
    assert settle_stale(engine, older_than_s=30, now=T0 + 55) == 1
    s = spend(engine, key, now=T0)
    assert (s.spent_micro_usd, s.reserved_micro_usd) == (200_000, 200_000)
    assert settle(engine, fresh.reservation_id, tokens=50, cost_usd=0.2, now=T0 + 56)
    assert prune(engine, before=T0 + 100) == 3  # the bucket of T0 (T0+50's still counts), two reservations
    assert window_usage(engine, key, now=T0) == (0, 0)
    assert window_usage(engine, key, now=T0 + 100) == (1, 50)


def test_negative_or_non_finite_costs_refused(engine):
    key, _ = create_key(engine, "n", budget_usd=1.0, period="day")
    with pytest.raises(ValueError):
        admit(engine, key, est_cost_usd=float("nan"), now=T0)
    d = admit(engine, key, est_cost_usd=0.1, now=T0)
    with pytest.raises(ValueError):
        settle(engine, d.reservation_id, tokens=0, cost_usd=-1.0, now=T0)
    with pytest.raises(ValueError):
        settle(engine, d.reservation_id, tokens=-1, cost_usd=0.0, now=T0)


# ------------------------------------------------------------------------------------ contention

RPM = 50


def test_threads_race_for_one_key_exactly_rpm_admitted(db_url):
    from db.engine import dispose_all, get_engine

    engine = get_engine(db_url)
    try:
        key, _ = create_key(engine, "hot", rpm=RPM, budget_usd=100, period="day")
        barrier = threading.Barrier(8)

        def worker(_i: int) -> list[bool]:
            barrier.wait(timeout=30)
            return [admit(engine, key, est_cost_usd=0.01, now=T0 + 1).allowed for _ in range(12)]

        with ThreadPoolExecutor(8) as pool:
            results = [ok for batch in pool.map(worker, range(8)) for ok in batch]
        assert len(results) == 96 and sum(results) == RPM
        assert window_usage(engine, key, now=T0 + 1)[0] == RPM
        s = spend(engine, key, now=T0)
        assert s.reserved_micro_usd == RPM * 10_000  # exactly the admitted requests' reservations
    finally:
        dispose_all()
