"""The monitor read path (app.monitor's series, stats and export over the db.monitor queries) on
SQLite and PostgreSQL, against attempt records written through db.requests.insert_batch at
controlled timestamps."""

from __future__ import annotations

import csv
import io
import itertools
import random

import pytest

from app import monitor as m
from core.histogram import GROWTH
from core.records import AttemptRecord
from db import monitor as dbm
from db.requests import insert_batch

DAY0 = 1_700_006_400  # a UTC midnight
T0 = DAY0 + 12 * 3600  # noon UTC: every step boundary
_ids = itertools.count()


def rec(
    ts: float,
    *,
    provider="alpha",
    model="m1",
    intent="general",
    source="api",
    side="primary",
    ok=True,
    latency=100.0,
    ttft=None,
    final=True,
    fallback=False,
    prompt=0,
    cached=0,
    completion=0,
    cost=0.0,
    attempt=1,
    rid=None,
    error_class=None,
    prompt_text=None,
) -> AttemptRecord:
    return AttemptRecord(
        request_id=rid or f"r{next(_ids)}",
        attempt=attempt,
        ts=ts,
        provider=provider,
        model=model,
        requested_model="auto",
        intent=intent,
        side=side,
        status="ok" if ok else "error",
        latency_ms=latency,
        http_status=200 if ok else 503,
        error_class=None if ok else (error_class or "server_error"),
        ttft_ms=ttft,
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        cost_usd=cost,
        fallback=fallback,
        final=final,
        source=source,
        prompt_text=prompt_text,
    )


@pytest.fixture(autouse=True)
def _fresh_cache():
    m.clear_cache()
    yield
    m.clear_cache()


# -- step and axis -------------------------------------------------------------------------------


@pytest.mark.parametrize("window_s", [900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400])
@pytest.mark.parametrize("offset", [0.0, 17.5, 299.9, 3599.0])
def test_any_window_has_bounded_whole_minute_buckets(window_s, offset):
    until = T0 + offset
    step = m.choose_step(window_s)
    starts, secs = m.bucket_axis(until - window_s, until, step)
    assert step % 60 == 0
    assert len(starts) <= m.MAX_POINTS
    assert starts[0] <= until - window_s < starts[0] + step and starts[-1] <= until < starts[-1] + step
    assert all(b - a == step for a, b in itertools.pairwise(starts))
    assert all(s == step for s in secs[:-1]) and 1.0 <= secs[-1] <= step


def test_steps_per_window():
    assert [m.choose_step(w) for w in (900, 3600, 6 * 3600, 86400, 7 * 86400)] == [60, 60, 120, 300, 3600]


# -- window_series ---------------------------------------------------------------------------------


def _scenario(engine):
    """Minute 0: alpha serves 3 requests (one streamed), one more fails on alpha and is served by beta
    (fallback). Minute 2: beta serves one request of model m2 from another source."""
    b0, b2 = T0, T0 + 120
    records = [
        rec(b0 + 1, prompt=100, cached=50, completion=10, cost=0.01, latency=100),
        rec(b0 + 2, prompt=100, cached=0, completion=20, cost=0.02, latency=200, ttft=50),
        rec(b0 + 3, prompt=200, cached=100, completion=30, cost=0.03, latency=300),
        rec(b0 + 4, rid="fb", ok=False, final=False, latency=40),
        rec(
            b0 + 5,
            rid="fb",
            attempt=2,
            provider="beta",
            fallback=True,
            prompt=100,
            completion=10,
            cost=0.005,
            latency=150,
        ),
        rec(
            b2 + 10,
            provider="beta",
            model="m2",
            source="loadgen",
            side="fallback",
            prompt=400,
            cached=400,
            completion=60,
            cost=0.1,
            latency=500,
            intent="coding",
        ),
    ]
    insert_batch(engine, records)
    return records


def test_window_series_counts_rates_and_costs(engine):
    _scenario(engine)
    until = T0 + 3 * 60 + 30  # half-way through minute 3
    s = m.window_series(engine, since=until - 900, until=until)
    assert s.step_s == 60
    i0, i2 = s.buckets.index(T0), s.buckets.index(T0 + 120)
    assert s.seconds[-1] == 30.0 and s.seconds[i0] == 60.0
    assert list(s.providers) == ["alpha", "beta"] and list(s.models) == ["m1", "m2"]
    a, b = s.providers["alpha"], s.providers["beta"]
    assert (a.requests[i0], a.attempts[i0], a.errors[i0]) == (3, 4, 1)
    assert a.error_rate[i0] == pytest.approx(0.25)
    assert a.request_rate[i0] == pytest.approx(3 / 60)
    assert (b.requests[i0], b.requests[i2]) == (1, 1)
    assert s.requests[i0] == 4 and s.request_rate[i0] == pytest.approx(4 / 60)
    assert s.fallback_rate[i0] == pytest.approx(0.25) and s.request_error_rate[i0] == 0.0
    assert s.error_rate[i0] == pytest.approx(1 / 5)
    assert s.fallback_rate[i0 + 1] is None  # idle bucket: no ratio, zero counts
    assert s.requests[i0 + 1] == 0 and s.cost_per_min[i0 + 1] == 0.0
    assert a.cost_usd[i0] == pytest.approx(0.06) and a.cost_per_min[i0] == pytest.approx(0.06)
    assert a.cum_cost_usd[-1] == pytest.approx(0.06) and b.cum_cost_usd[-1] == pytest.approx(0.105)
    assert s.cum_cost_usd[-1] == pytest.approx(0.165)
    assert s.models["m1"].cum_cost_usd[-1] == pytest.approx(0.065)
    assert s.models["m2"].cost_usd[i2] == pytest.approx(0.1) and s.models["m2"].requests[i2] == 1
    assert a.cached_ratio[i0] == pytest.approx(150 / 400) and b.cached_ratio[i2] == 1.0
    assert a.tokens_per_s[i0] == pytest.approx(60 / 60)
    t = s.totals
    assert (t.requests, t.attempts, t.errors, t.fallbacks) == (5, 6, 1, 1)
    assert t.cost_usd == pytest.approx(0.165) and t.cached_ratio == pytest.approx(550 / 900)
    assert t.seconds == pytest.approx(sum(s.seconds))
    assert a.ttft.p50[i0] is not None and a.ttft.p50[i0 + 1] is None and b.ttft.p50[i0] is None


def test_last_bucket_rate_uses_elapsed_seconds(engine):
    insert_batch(engine, [rec(T0 + k) for k in range(10)])
    s = m.window_series(engine, since=T0 - 600, until=T0 + 10)
    assert s.buckets[-1] == T0 and s.seconds[-1] == 10.0
    assert s.request_rate[-1] == pytest.approx(1.0)


def test_percentiles_within_histogram_resolution(engine):
    rng = random.Random(3)
    lat = [rng.uniform(80, 2000) for _ in range(2000)]
    ttft = [rng.uniform(20, 400) for _ in range(2000)]
    insert_batch(
        engine, [rec(T0 + 5 + i * 0.01, latency=v, ttft=t) for i, (v, t) in enumerate(zip(lat, ttft, strict=False))]
    )
    s = m.window_series(engine, since=T0, until=T0 + 60)
    a = s.providers["alpha"]
    i = s.buckets.index(T0)
    for values, pct, window in ((lat, a.latency, a.window_latency), (ttft, a.ttft, a.window_ttft)):
        exact = sorted(values)
        for k, q in enumerate(m.QUANTILES):
            true = exact[int(q * len(exact)) - 1]
            got = (pct.p50, pct.p95, pct.p99)[k][i]
            assert true / GROWTH <= got <= true * GROWTH
            assert window[k] == pytest.approx(got)
    assert s.totals.latency[1] == pytest.approx(a.latency.p95[i])


def test_day_of_traffic_is_bucketed_to_bounded_points(engine):
    recs = [rec(T0 - 86400 + k * 173.0 + 0.5, provider=("alpha", "beta")[k % 2], cost=0.001) for k in range(500)]
    insert_batch(engine, recs)
    s = m.window_series(engine, since=T0 - 86400, until=T0)
    assert s.step_s == 300 and len(s.buckets) <= m.MAX_POINTS
    assert all(len(p.requests) == len(s.buckets) for p in s.providers.values())
    inside = [r for r in recs if s.buckets[0] <= r.ts <= T0 + 60]
    assert s.totals.requests == len(inside) and sum(s.requests) == len(inside)
    assert s.cum_cost_usd[-1] == pytest.approx(0.001 * len(inside))
    assert s.cum_cost_usd == tuple(sorted(s.cum_cost_usd))


def test_filters_select_subsets(engine):
    _scenario(engine)
    until = T0 + 240
    kwargs = dict(since=until - 900, until=until)
    everything = m.window_series(engine, **kwargs, filters=m.MonitorFilters())
    assert everything.totals.requests == 5
    beta = m.window_series(engine, **kwargs, filters=m.MonitorFilters(providers=["beta"]))
    assert list(beta.providers) == ["beta"] and beta.totals.requests == 2
    assert m.window_series(engine, **kwargs, filters=m.MonitorFilters(models=["m2"])).totals.requests == 1
    assert m.window_series(engine, **kwargs, filters=m.MonitorFilters(intents=["coding"])).totals.requests == 1
    loadgen = m.window_series(engine, **kwargs, filters=m.MonitorFilters(sources=["loadgen", "nope"]))
    assert loadgen.totals.requests == 1 and list(loadgen.models) == ["m2"]
    both = m.MonitorFilters(providers=["alpha"], models=["m2"])
    assert m.window_series(engine, **kwargs, filters=both).empty
    assert m.MonitorFilters(providers=["b", "a", "a"]) == m.MonitorFilters(providers=("a", "b"))


def test_settled_buckets_are_cached_and_the_tail_is_live(engine):
    old = T0 - 3600
    insert_batch(engine, [rec(old + 1)])
    until = T0 + 30
    first = m.window_series(engine, since=until - 6 * 3600, until=until)
    assert first.totals.requests == 1
    insert_batch(engine, [rec(T0 + 5), rec(old + 2)])  # one live, one late write to a settled bucket
    second = m.window_series(engine, since=until - 6 * 3600, until=until)
    assert second.totals.requests == 2  # the settled bucket came from the cache
    assert m.window_series(engine, since=until - 6 * 3600, until=until, use_cache=False).totals.requests == 3
    m.clear_cache()
    assert m.window_series(engine, since=until - 6 * 3600, until=until).totals.requests == 3


def test_empty_window(engine):
    s = m.window_series(engine, since=T0 - 900, until=T0)
    assert s.empty and s.providers == {} and s.totals.requests == 0 and s.totals.latency == (None, None, None)
    assert len(s.buckets) == len(s.requests) == 16


# -- overview, health, split -----------------------------------------------------------------------


def test_overview_stats(engine):
    now = T0 + 600
    insert_batch(
        engine,
        [
            rec(DAY0 - 30, cost=5.0),  # yesterday: not in today's cost
            rec(T0 - 3600, cost=1.0),  # today, outside the window
            rec(now - 120, cost=0.5, latency=100, prompt=10, completion=5),
            rec(now - 100, cost=0.25, latency=100, prompt=10, completion=5, ttft=30),
            rec(now - 90, rid="x", ok=False, final=False, latency=1000),
            rec(now - 80, rid="x", attempt=2, provider="beta", fallback=True, cost=0.25, latency=100),
            rec(now - 60, ok=False, latency=100),  # a failed request
        ],
    )
    o = m.overview_stats(engine, now=now, window_s=900)
    assert (o.requests, o.attempts, o.errors, o.fallbacks) == (4, 5, 1, 1)
    assert o.error_rate == pytest.approx(0.25) and o.fallback_rate == pytest.approx(0.25)
    assert o.cost_window_usd == pytest.approx(1.0) and o.cost_today_usd == pytest.approx(2.0)
    assert o.tokens == 30
    assert 100 / GROWTH <= o.p50_ms <= 100 * GROWTH and o.p95_ms > o.p50_ms
    assert o.ttft_p50_ms is not None
    empty = m.overview_stats(engine, now=now + 86400 * 3)
    assert empty.requests == 0 and empty.error_rate is None and empty.p50_ms is None and empty.cost_today_usd == 0


def test_provider_health(engine):
    now = T0 + 600
    insert_batch(
        engine,
        [
            rec(now - 200, ok=False, error_class="rate_limited"),
            rec(now - 100, ok=False, error_class="timeout"),
            rec(now - 50),
            rec(now - 40),
            rec(now - 3000, provider="beta", ok=False),  # outside the window
            rec(now - 30, provider="beta"),
        ],
    )
    h = m.provider_health(engine, providers=["alpha", "beta", "idle"], now=now, window_s=300)
    assert set(h) == {"alpha", "beta", "idle"}
    a = h["alpha"]
    assert (a.attempts, a.errors, a.requests) == (4, 2, 4) and a.error_rate == pytest.approx(0.5)
    assert a.last_error_class == "timeout" and a.last_error_at == pytest.approx(now - 100)
    assert a.p50_ms is not None
    assert (h["beta"].attempts, h["beta"].errors, h["beta"].last_error_class) == (1, 0, None)
    assert h["idle"].attempts == 0 and h["idle"].error_rate is None
    assert m.provider_health(engine, providers=[], now=now) == {}


def test_observed_split(engine):
    now = T0 + 5 * 60 + 20
    recs = [rec(T0 + 60 * k + j, side="primary") for k in range(5) for j in range(k)]
    recs += [rec(T0 + 60 * k + 30, side="fallback", provider="beta") for k in range(5)]
    recs += [
        rec(T0 + 10, side="primary", ok=False, final=False, rid="z"),
        rec(T0 + 11, side="primary", provider="beta", attempt=2, fallback=True, rid="z"),
    ]
    insert_batch(engine, recs)
    pts = m.observed_split(engine, now=now, minutes=6)
    assert [p.ts for p in pts] == [T0 + 60 * k for k in range(6)]
    assert [(p.primary, p.fallback) for p in pts] == [(1, 1), (1, 1), (2, 1), (3, 1), (4, 1), (0, 0)]
    assert pts[3].primary_share == pytest.approx(0.75) and pts[-1].primary_share is None
    assert all(p.step_s == 60 for p in pts)
    long = m.observed_split(engine, now=now, minutes=7 * 1440)
    assert len(long) <= m.MAX_POINTS and sum(p.total for p in long) == 16


# -- raw rows ----------------------------------------------------------------------------------------


def test_recent_requests_order_limit_filters(engine):
    insert_batch(
        engine, [rec(T0 + k, provider=("alpha", "beta")[k % 2], prompt_text="secret prompt") for k in range(30)]
    )
    rows = m.recent_requests(engine, limit=10)
    assert len(rows) == 10 and [r["ts"] for r in rows] == [T0 + k for k in range(29, 19, -1)]
    assert list(rows[0]) == list(m.RECENT_COLUMNS) and "prompt_text" not in rows[0]
    assert rows[0]["time_utc"].endswith("Z") and rows[0]["time_utc"].startswith("2023-11-15T12:00:29")
    beta = m.recent_requests(engine, limit=100, filters=m.MonitorFilters(providers=["beta"]))
    assert len(beta) == 15 and {r["provider"] for r in beta} == {"beta"}
    assert len(m.recent_requests(engine, since=T0 + 25)) == 5
    assert m.recent_requests(engine, limit=1, include_prompt=True)[0]["prompt_text"] == "secret prompt"


def test_requests_csv_round_trip(engine):
    insert_batch(engine, [rec(T0 + 1, ok=False, error_class='bad, "quoted"', cost=0.125), rec(T0 + 2)])
    rows = m.recent_requests(engine)
    parsed = list(csv.DictReader(io.StringIO(m.requests_csv(rows))))
    assert len(parsed) == 2 and list(parsed[0]) == list(rows[0])
    assert parsed[1]["error_class"] == 'bad, "quoted"' and float(parsed[1]["cost_usd"]) == 0.125
    assert parsed[0]["ttft_ms"] == "" and parsed[0]["request_id"] == rows[0]["request_id"]
    assert next(csv.reader(io.StringIO(m.requests_csv([])))) == list(m.RECENT_COLUMNS)


def test_has_requests_and_filter_options(engine):
    assert not dbm.has_requests(engine)
    assert dbm.filter_options(engine, since=0) == {"providers": [], "models": [], "intents": [], "sources": []}
    _scenario(engine)
    assert dbm.has_requests(engine)
    assert dbm.filter_options(engine, since=T0 - 60) == {
        "providers": ["alpha", "beta"],
        "models": ["m1", "m2"],
        "intents": ["coding", "general"],
        "sources": ["api", "loadgen"],
    }
    assert dbm.filter_options(engine, since=T0 + 120)["sources"] == ["loadgen"]


def test_settled_cache_expires_on_its_injected_clock(engine):
    clock = [1000.0]
    cache = m.SettledCache(clock=lambda: clock[0])
    old = T0 - 3600
    insert_batch(engine, [rec(old + 1)])
    until = T0 + 30
    window = {"since": until - 6 * 3600, "until": until, "cache": cache}
    assert m.window_series(engine, **window).totals.requests == 1
    insert_batch(engine, [rec(old + 2)])  # a late write to a settled bucket
    clock[0] += m.SettledCache.TTL_S  # not yet past the entry's lifetime
    assert m.window_series(engine, **window).totals.requests == 1
    clock[0] += 1
    assert m.window_series(engine, **window).totals.requests == 2  # expired: read in full again
    assert m.window_series(engine, since=until - 6 * 3600, until=until).totals.requests == 2  # own cache


def test_db_returns_the_cells_sql_summed(engine):
    insert_batch(
        engine,
        [
            rec(T0 + 1, provider="alpha", model="m1", prompt=10, cached=4, completion=5, cost=0.5, latency=100),
            rec(T0 + 2, provider="alpha", model="m2", ok=False, cost=0.25, latency=200),
            rec(T0 + 70, provider="beta", model="m1", completion=7, cost=1.0, latency=300),
        ],
    )
    cells = dbm.bucket_cells(engine, since=T0, until=T0 + 119, step=60, filters=dbm.NO_FILTERS)
    assert sorted(cells) == [T0, T0 + 60]
    alpha = cells[T0][0]["alpha"]
    assert (alpha.count("attempts"), alpha.count("errors"), alpha.count("requests")) == (2, 1, 2)
    assert (alpha.count("prompt_tokens"), alpha.count("cached_tokens"), alpha.count("completion_tokens")) == (10, 4, 5)
    assert alpha.cost == pytest.approx(0.75) and sum(alpha.lat) == 2 and alpha.ttft is None
    assert {n: c.count("requests") for n, c in cells[T0][1].items()} == {"m1": 1, "m2": 1}
    assert cells[T0 + 60][0]["beta"].count("completion_tokens") == 7 and list(cells[T0 + 60][0]) == ["beta"]
