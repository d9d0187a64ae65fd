"""The monitor read path (app.monitor's series, stats and export over the db.monitor queries) on
SQLite and PostgreSQL, against attempt records written through db.requests.insert_batch at
controlled timestamps."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import random
from collections import defaultdict

import pytest
from sqlalchemy import select

from app import monitor as m
from core.histogram import GROWTH
from core.records import AttemptRecord
from db import monitor as dbm
from db import raw_log
from db.engine import create_db_engine
from db.migrate import upgrade
from db.models import (
    ERROR_ROLLUP_KEY,
    ERROR_ROLLUP_TABLES,
    NO_ERROR_CLASS,
    NO_ROUTE,
    SUBSTITUTION_ROLLUP_KEY,
    SUBSTITUTION_ROLLUP_SUMS,
    SUBSTITUTION_ROLLUP_TABLES,
    RequestLog,
)
from db.partitions import KEEPER
from db.requests import insert_batch, prune

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


def test_a_days_cost_is_summed_from_hours_five_minutes_and_minutes_exactly(engine) -> None:
    """Today's cost reads whole hours from the hourly rollups and whole five minutes from theirs,
    so it costs the same at 23:59 as at 00:01 (one minute row per combination since midnight grows
    with the time of day and the traffic); the sum is the minutes' own, at every edge."""
    from sqlalchemy import event

    rng = random.Random(7)
    records = [
        rec(DAY0 + rng.uniform(-600, 20 * 3600), cost=round(rng.uniform(0, 0.5), 4), provider=rng.choice(("a", "b")))
        for _ in range(3000)
    ]
    insert_batch(engine, records)

    def want(since: float, until: float) -> float:
        first, last = -(-int(since) // 60) * 60, int(until) // 60 * 60
        return sum(r.cost_usd for r in records if first <= int(r.ts) // 60 * 60 <= last)

    tables: list[str] = []

    def grab(conn, cursor, statement, parameters, context, executemany) -> None:
        tables.extend(t for t in ("request_rollup_1h", "request_rollup_5m") if t in statement)

    event.listen(engine, "before_cursor_execute", grab)
    try:
        for since, until in [
            (DAY0, DAY0 + 19 * 3600 + 17 * 60 + 31.5),  # today so far, mid-minute
            (DAY0 + 61, DAY0 + 3 * 3600 + 299),  # edges off every boundary
            (DAY0 + 300, DAY0 + 600),  # five minutes exactly, the end minute included
            (DAY0 + 125, DAY0 + 170),  # inside two minutes
            (DAY0 + 170, DAY0 + 130),  # an empty span
        ]:
            assert dbm.cost_between(engine, since=since, until=until) == pytest.approx(want(since, until), abs=1e-9)
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    assert "request_rollup_1h" in tables and "request_rollup_5m" in tables


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
    assert dbm.filter_options(engine, since=0) == {
        "providers": [], "models": [], "intents": [], "sources": [], "routes": [], "deployments": [],
    }  # fmt: skip
    _scenario(engine)
    assert dbm.has_requests(engine)
    assert dbm.filter_options(engine, since=T0 - 60) == {
        "providers": ["alpha", "beta"],
        "models": ["m1", "m2"],
        "intents": ["coding", "general"],
        "sources": ["api", "loadgen"],
        "routes": [],
        "deployments": [],
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


@pytest.mark.parametrize("step", [60, 120, 300, 600, 3600])
def test_buckets_of_every_step_hold_the_raw_rows_of_their_minutes(engine, step):
    # A step equal to a rollup table's span (60, 300, 3600) groups by its minute column; other
    # steps by a computed bucket. Either way each bucket holds exactly its minutes' attempts.
    rng = random.Random(step)
    rows = [
        rec(
            T0 + rng.uniform(0, 3 * 3600),
            provider=rng.choice(("alpha", "beta")),
            model=rng.choice(("m1", "m2", "m3")),
            ok=rng.random() > 0.2,
            latency=rng.choice((50.0, 400.0, 3000.0)),
        )
        for _ in range(400)
    ]
    insert_batch(engine, rows)
    cells = dbm.bucket_cells(engine, since=T0, until=T0 + 3 * 3600 - 1, step=step, filters=dbm.NO_FILTERS)
    want_p: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    want_m: dict[tuple[int, str], int] = defaultdict(int)
    for r in rows:
        b = int(r.ts // step) * step
        want_p[b, r.provider][0] += 1
        want_p[b, r.provider][1] += r.status == "error"
        want_m[b, r.model] += 1
    got_p = {(b, n): [c.count("attempts"), c.count("errors")] for b, (ps, _) in cells.items() for n, c in ps.items()}
    assert got_p == dict(want_p)
    assert {(b, n): sum(c.lat or ()) for b, (ps, _) in cells.items() for n, c in ps.items()} == {
        k: v[0] for k, v in want_p.items()
    }
    assert {(b, n): c.count("requests") for b, (_, ms) in cells.items() for n, c in ms.items()} == dict(want_m)


# -- detail rollups --------------------------------------------------------------------------------
# The error-class and substitution rollups (migration 0013) on SQLite and PostgreSQL: what the
# writer folds equals a recount of the raw rows, per minute and per hour, through replayed batches,
# pruning and the migration's backfill; the monitor's reads built on them (error-class choices,
# substitution sums, the request table's count) answer what the raw rows answer, for windows and
# cursors that do not fall on minute boundaries.


T_ROLLUPS = 1_800_000_000 // 86_400 * 86_400 - 2 * 3600  # 22:00 UTC of a day in 2027: the span crosses midnight
SPAN_S = 3 * 3600 + 17 * 60  # past hour boundaries, with partial minutes and hours
PROVIDERS = ("alpha", "beta", "gateway")
MODELS = ("m1", "m2")
CLASSES = ("timeout", "server_error", "rate_limited", None)


def make_records(n: int, seed: int = 1) -> list[AttemptRecord]:
    """``n`` attempts over :data:`SPAN_S` from ``T_ROLLUPS``: failures of every class (and none),
    substitutions, final and not, several providers, models, sources and keys."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        failed = rng.random() < 0.3
        out.append(
            AttemptRecord(
                request_id=f"q{seed}-{i:05d}",
                attempt=1 + rng.randrange(2),
                ts=T_ROLLUPS + rng.random() * SPAN_S,
                provider=rng.choice(PROVIDERS),
                model=rng.choice(MODELS),
                requested_model=rng.choice(("auto", "m1", "m3")),
                intent=rng.choice(("coding", "general")),
                side="primary",
                status="error" if failed else "ok",
                latency_ms=10.0,
                error_class=rng.choice(CLASSES) if failed else None,
                prompt_tokens=rng.randrange(100),
                cached_tokens=rng.randrange(10),
                completion_tokens=rng.randrange(50),
                cost_usd=rng.randrange(1000) / 1e6,
                final=rng.random() < 0.8,
                substituted=rng.random() < 0.2,
                source=rng.choice(("api", "loadgen")),
                key_name=rng.choice(("k1", None)),
                route=rng.choice(("r1", None)),
            )
        )
    return out


def raw_rows(engine) -> list:
    with engine.connect() as conn:
        return list(conn.execute(select(RequestLog.__table__)).mappings())


def _dims(r, span: int) -> tuple:
    return (
        int(r["ts"] // span) * span, r["provider"], r["model"], r["requested_model"], r["intent"], r["source"],
        r["route"] or NO_ROUTE,
    )  # fmt: skip


def recount_errors(rows, span: int) -> dict[tuple, tuple[int, int]]:
    acc: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["status"] != "ok":
            cell = acc[(*_dims(r, span), r["error_class"] or NO_ERROR_CLASS)]
            cell[0] += 1
            cell[1] += bool(r["final"])
    return {k: tuple(v) for k, v in acc.items()}


def recount_substitutions(rows, span: int) -> dict[tuple, tuple]:
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for r in rows:
        if r["substituted"] and r["final"]:
            cell = acc[_dims(r, span)]
            for i, name in enumerate(("prompt_tokens", "cached_tokens", "completion_tokens")):
                cell[1 + i] += r[name]
            cell[0] += 1
            cell[4] += r["cost_usd"]
    return {k: (*v[:4], round(v[4], 9)) for k, v in acc.items()}


def stored_errors(engine, span: int) -> dict[tuple, tuple[int, int]]:
    t = ERROR_ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]
    cols = [t.c[k] for k in ERROR_ROLLUP_KEY] + [t.c.attempts, t.c.requests]
    with engine.connect() as conn:
        return {tuple(r[:8]): (int(r[8]), int(r[9])) for r in conn.execute(select(*cols))}


def stored_substitutions(engine, span: int) -> dict[tuple, tuple]:
    t = SUBSTITUTION_ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]
    cols = [t.c[k] for k in (*SUBSTITUTION_ROLLUP_KEY, *SUBSTITUTION_ROLLUP_SUMS)]
    with engine.connect() as conn:
        return {tuple(r[:7]): (*(int(v) for v in r[7:11]), round(float(r[11]), 9)) for r in conn.execute(select(*cols))}


def assert_rollups_match_log(engine) -> None:
    rows = raw_rows(engine)
    for span in (60, 3600):
        assert stored_errors(engine, span) == recount_errors(rows, span)
        assert stored_substitutions(engine, span) == recount_substitutions(rows, span)


def test_rollups_equal_a_recount_of_the_log_through_batches_and_replays(engine) -> None:
    records = make_records(600)
    for i in range(0, len(records), 70):
        insert_batch(engine, records[i : i + 70])
    insert_batch(engine, records[100:300])  # a replayed batch (journal after a crash) adds nothing
    rows = raw_rows(engine)
    assert len(rows) == 600
    assert sum(a for a, _ in stored_errors(engine, 60).values()) == sum(r["status"] != "ok" for r in rows) > 100
    assert sum(v[0] for v in stored_substitutions(engine, 3600).values()) > 50
    assert_rollups_match_log(engine)


def _raw_classes(rows, since, until) -> list[str]:
    return sorted(
        {r["error_class"] for r in rows if r["status"] != "ok" and since <= r["ts"] <= until and r["error_class"]}
    )


def _raw_subs(rows, since, until, providers=()) -> dict[tuple, tuple]:
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for r in rows:
        if (
            r["substituted"]
            and r["final"]
            and since <= r["ts"] <= until
            and (not providers or r["provider"] in providers)
        ):
            cell = acc[(r["provider"], r["model"], r["requested_model"], r["intent"])]
            cell[0] += 1
            cell[1] += r["prompt_tokens"]
            cell[2] += r["cached_tokens"]
            cell[3] += r["completion_tokens"]
            cell[4] += r["cost_usd"]
    return {k: (*v[:4], round(v[4], 9)) for k, v in acc.items()}


def _windows(rows, rng: random.Random, n: int) -> list[tuple[float, float]]:
    # Windows ending on, just after and between rows; some shorter than two minutes, some hours long.
    out = [
        (T_ROLLUPS - 60.0, T_ROLLUPS + SPAN_S + 60.0),
        (T_ROLLUPS, T_ROLLUPS + 3600.0),
        (T_ROLLUPS + 59.5, T_ROLLUPS + 61.0),
    ]
    stamps = sorted(r["ts"] for r in rows)
    for _ in range(n):
        a, b = sorted(rng.sample(stamps, 2))
        out.append((a, b))
        out.append((a + rng.random() * 30, a + rng.random() * 150))
    return out


def test_error_classes_and_substitutions_answer_what_the_raw_rows_answer(engine) -> None:
    insert_batch(engine, make_records(500, seed=2))
    rows = raw_rows(engine)
    rng = random.Random(3)
    for since, until in _windows(rows, rng, 12):
        assert dbm.error_classes_between(engine, since=since, until=until) == _raw_classes(rows, since, until)
        got = {
            (s.provider, s.model, s.requested_model, s.intent): (
                s.requests,
                s.prompt_tokens,
                s.cached_tokens,
                s.completion_tokens,
                round(s.cost_usd, 9),
            )
            for s in dbm.substitution_sums(engine, since=since, until=until)
        }
        assert got == _raw_subs(rows, since, until), (since, until)
    only_beta = dbm.substitution_sums(
        engine,
        since=T_ROLLUPS,
        until=T_ROLLUPS + SPAN_S,
        filters=dbm.MonitorFilters(providers=("beta",)),
    )
    assert {s.provider for s in only_beta} == {"beta"}
    assert len(only_beta) == len(_raw_subs(rows, T_ROLLUPS, T_ROLLUPS + SPAN_S, ("beta",)))


def test_pruning_keeps_the_rollups_equal_to_the_rows_that_remain(engine) -> None:
    insert_batch(engine, make_records(500, seed=6))
    # Midnight: every resolution is cut at the same instant, and on PostgreSQL the day partition
    # before it is dropped whole.
    cutoff = float(T_ROLLUPS + 2 * 3600)
    out = prune(engine, raw_before=cutoff, minute_rollups_before=cutoff, rollups_1h_before=cutoff)
    assert out["request_error_rollup"] > 0 and out["request_substitution_rollup_1h"] > 0
    rows = raw_rows(engine)
    assert rows and min(r["ts"] for r in rows) >= cutoff
    assert_rollups_match_log(engine)
    assert dbm.error_classes_between(engine, since=T_ROLLUPS, until=T_ROLLUPS + SPAN_S) == _raw_classes(
        rows, T_ROLLUPS, T_ROLLUPS + SPAN_S
    )


def test_migration_0013_backfills_from_the_rows_already_logged(empty_db_url: str) -> None:
    engine = create_db_engine(empty_db_url)
    upgrade(engine, "0012")
    records = make_records(400, seed=8)
    if engine.dialect.name == "postgresql":
        KEEPER.forget()
        KEEPER.ensure(engine, {r.ts for r in records})
    with engine.begin() as conn:
        conn.execute(RequestLog.__table__.insert(), [_row(r) for r in records])
    upgrade(engine)
    assert_rollups_match_log(engine)
    # The writer continues on top of the backfilled cells.
    insert_batch(engine, make_records(100, seed=9))
    assert_rollups_match_log(engine)
    KEEPER.forget()
    engine.dispose()


def _row(r: AttemptRecord) -> dict:
    """A row as the log had it at revision 0012 (the route columns arrive with 0015)."""
    from core.records import FIELD_NAMES

    later = {"route", "deployment", "route_why", "refused", "tool_json_bad", "schema_bad", "chunk_gap_ms"}
    return {k: v for k, v in zip(FIELD_NAMES, r.to_tuple(), strict=True) if k not in later}


# -- routes and deployments ------------------------------------------------------------------------
# A deployment is a route's (provider, model); the rollups key by route ('' for the two-sided
# routing), the raw log has route and deployment columns. The same filter means the same rows on both.


def _routed(ts: float, provider: str, model: str, route: str | None, ok: bool = True) -> AttemptRecord:
    r = rec(ts, provider=provider, model=model, ok=ok)
    deployment = dbm.deployment_key(provider, model) if route else None
    return dataclasses.replace(r, route=route, deployment=deployment)


def test_route_and_deployment_filters_mean_the_same_rows_in_the_rollups_and_the_log(engine):
    records = [
        _routed(T0 + 1, "alpha", "m1", "r1"),
        _routed(T0 + 2, "alpha", "m1", "r1", ok=False),
        _routed(T0 + 3, "beta", "org/model-7b", "r1"),  # a model name with a slash
        _routed(T0 + 4, "alpha", "m1", "r2"),
        _routed(T0 + 5, "alpha", "m1", None),  # the two-sided routing, same provider and model
        _routed(T0 + 6, "alpha", "m1", None),
    ]
    insert_batch(engine, records)
    cases = {
        dbm.MonitorFilters(routes=("r1",)): (3, 1),
        dbm.MonitorFilters(routes=("r1", "r2")): (4, 1),
        dbm.MonitorFilters(deployments=("alpha/m1",)): (3, 1),  # on r1 and r2, not the two-sided 2
        dbm.MonitorFilters(deployments=("beta/org/model-7b",)): (1, 0),
        dbm.MonitorFilters(routes=("r2",), deployments=("alpha/m1",)): (1, 0),
        dbm.MonitorFilters(routes=("r2",), deployments=("beta/org/model-7b",)): (0, 0),
        dbm.MonitorFilters(): (6, 1),
    }
    for filters, (attempts, errors) in cases.items():
        cell = dbm.window_cell(engine, since=T0, until=T0 + 60, filters=filters)
        assert (cell.count("attempts"), cell.count("errors")) == (attempts, errors), filters
        raw = raw_log.recent_counts(engine, since=T0, until=T0 + 60, filters=filters)
        assert (sum(c.attempts for c in raw.values()), sum(c.errors for c in raw.values())) == (attempts, errors)
    assert dbm.filter_options(engine, since=T0 - 60)["routes"] == ["r1", "r2"]
    assert dbm.filter_options(engine, since=T0 - 60)["deployments"] == ["alpha/m1", "beta/org/model-7b"]
    assert dbm.split_deployment("beta/org/model-7b") == ("beta", "org/model-7b")
    assert dbm.MonitorFilters(deployments=["x/y", "x/y"]).deployments == ("x/y",)
    assert dbm.MonitorFilters(routes=("r1",)).active


def test_the_level_breakdown_by_route_deployment(engine):
    from app.monitor.levels import breakdown, levels

    insert_batch(
        engine,
        [_routed(T0 + i, "alpha", "m1", "r1", ok=i > 0) for i in range(4)]
        + [_routed(T0 + 10, "beta", "m1", "r1")]
        + [_routed(T0 + 20 + i, "alpha", "m1", None) for i in range(3)],
    )
    b = breakdown(engine, since=T0, until=T0 + 60, cache=None)
    assert {k: c.count("attempts") for k, c in b.by_deployment.items()} == {("r1", "alpha/m1"): 4, ("r1", "beta/m1"): 1}
    table = levels(b, {})
    assert [(r.name, r.attempts) for r in table.routes] == [("r1", 5)]
    assert [(r.route, r.name, r.attempts, r.attempt_error_rate) for r in table.deployments] == [
        ("r1", "alpha/m1", 4, 0.25),
        ("r1", "beta/m1", 1, 0.0),
    ]
    # The provider filter keeps its deployments only
    only_beta = levels(
        breakdown(engine, since=T0, until=T0 + 60, filters=dbm.MonitorFilters(providers=("beta",)), cache=None), {}
    )
    assert [r.name for r in only_beta.deployments] == ["beta/m1"]


def test_the_error_class_choices_read_a_partial_minutes_failed_rows_from_their_ts_index(engine) -> None:
    """The partial minutes at a window's edges are read from the failed rows' ``ts`` index: a read
    that PostgreSQL can serve from the (error_class, ts) index instead walks every class's entries
    for that minute's ts range, a whole day's failures (20 ms at 30 M rows)."""
    from tests.support.query_plans import plans

    classes = ("timeout", "rate_limited", "server_error", "bad_response")
    start = float(T_ROLLUPS)
    records = [
        rec(start + k * 0.5, ok=k % 3 != 0, error_class=None if k % 3 else classes[k // 3 % 4]) for k in range(8000)
    ]
    insert_batch(engine, records)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE request_log")
    since, until = start + 130.25, start + 3700.75  # both edges inside a minute
    got = dbm.error_classes_between(engine, since=since, until=until)
    assert got == sorted(classes) == _raw_classes(raw_rows(engine), since, until)
    found = plans(engine, lambda: dbm.error_classes_between(engine, since=since, until=until))
    assert len(found) == 2  # the two partial minutes; the whole ones come from the rollups
    for plan in found:
        if engine.dialect.name == "sqlite":
            assert "ix_request_log_failed_ts" in plan, plan
        else:
            assert "error_class_ts_idx" not in plan and "Seq Scan" not in plan, plan
