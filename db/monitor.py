"""Read-side SQL for the dashboards: time series, KPIs, provider health, canary split, recent rows.

Everything that charts or summarises traffic reads the rollup tables (per minute, and per five
minutes and per hour for long windows: see :func:`db.models.rollup_table_for`), never the raw log, so
the cost of a query depends on the window's minutes and dimensions, not on the request volume.
The raw ``request_log`` is read only for bounded, index-ordered lookups (the newest rows, a
provider's latest error).

Time bucketing: a rollup's ``minute`` is the integer epoch second of the minute's start. A window
is cut into buckets of ``step`` seconds (a whole number of minutes chosen by :func:`choose_step` so
any window has at most :data:`MAX_POINTS` buckets); the bucket of a row is ``minute - minute % step``,
computed in SQL, and the counters and histogram columns are summed per bucket and dimension there.
Percentiles come from the summed histogram counts via :func:`core.histogram.percentile`,
so they are accurate to the histogram's resolution (about 15 %, usually much better).

Definitions used throughout (they follow the rollup's counters):

* requests = final attempts; attempts = every attempt including retries and fallbacks.
* error rate (per provider) = failed attempts / attempts on that provider: what that upstream did.
* request error rate = failed final attempts / requests: what callers saw.
* fallback rate = final attempts served by the fallback route / requests.
* latency and TTFT percentiles are per attempt (the rollup histograms hold every attempt).
* cached ratio = cached prompt tokens / prompt tokens.
* tokens/s = completion (output) tokens per second of wall-clock time: throughput.

The window is widened to start on a bucket boundary, so every bucket but the last is whole; the
last (still filling) bucket's rates divide by the seconds it has covered so far, so it does not dip.

Live refreshes re-read only the newest buckets: the cells of buckets that ended ten minutes or more
before the window's end are kept in a small in-process cache (:class:`_SettledCache`, refreshed in
full every five minutes). Results are frozen dataclasses of tuples, safe to cache and share.
"""

from __future__ import annotations

import csv
import io
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import BigInteger, Connection, Engine, and_, func, literal_column, select

from core.histogram import percentile
from db.models import LATENCY_BUCKETS, TTFT_BUCKETS, RequestLog, RequestRollup, rollup_table_for

MAX_POINTS = 300
# Steps a chart is cut into, in minutes: round numbers an operator reads at a glance.
NICE_STEPS_MIN = (1, 2, 3, 5, 10, 15, 20, 30, 60, 120, 180, 360, 720, 1440)
QUANTILES = (0.50, 0.95, 0.99)
RECENT_LIMIT_MAX = 5000

_COUNTS = (
    "attempts",
    "requests",
    "errors",
    "request_errors",
    "fallbacks",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
)

# Operator-facing columns of the recent-requests table, in display order. prompt_text is opt-in.
RECENT_COLUMNS = (
    "time_utc",
    "request_id",
    "attempt",
    "final",
    "provider",
    "model",
    "requested_model",
    "intent",
    "side",
    "source",
    "status",
    "http_status",
    "error_class",
    "error_message",
    "latency_ms",
    "ttft_ms",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "cost_usd",
    "fallback",
    "substituted",
    "stream",
    "session_id",
    "ts",
)


# ---------------------------------------------------------------------------------------------
# Filters and the time axis
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorFilters:
    """Dimension filters; an empty tuple means "all". Lists are accepted and stored as tuples so a
    filter is hashable (a cache key)."""

    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    intents: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("providers", "models", "intents", "sources"):
            object.__setattr__(self, name, tuple(sorted(set(getattr(self, name) or ()))))

    @property
    def active(self) -> bool:
        return bool(self.providers or self.models or self.intents or self.sources)


NO_FILTERS = MonitorFilters()


def choose_step(window_s: float, max_points: int = MAX_POINTS) -> int:
    """Bucket width in seconds: the smallest round number of minutes that cuts ``window_s`` into at
    most ``max_points`` buckets (two are reserved for a first and last bucket cut by the window)."""
    minutes = max(window_s, 60.0) / 60.0
    for step in NICE_STEPS_MIN:
        if minutes / step + 2 <= max_points:
            return step * 60
    days = math.ceil(minutes / (max_points - 2) / 1440)
    return days * 1440 * 60


def _minute_floor(ts: float) -> int:
    return int(ts // 60) * 60


def bucket_axis(since: float, until: float, step: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Bucket starts covering ``[since, until]`` and the seconds each covers.

    The window is widened to start on a bucket boundary (at most one step earlier than ``since``),
    so every bucket but the last is whole; the last ends at ``until`` and may still be filling, so
    its seconds are ``until - start`` (at least 1) and a rate over it does not dip.
    """
    first = int(since // step) * step
    last = int(max(until, since) // step) * step
    starts = tuple(range(first, last + 1, step))
    covered = tuple(float(step) if b + step <= until else max(until - b, 1.0) for b in starts)
    return starts, covered


def _dimension_filter(filters: MonitorFilters | None, table) -> list:
    f = filters or NO_FILTERS
    conds = []
    for values, col in (
        (f.providers, table.c.provider),
        (f.models, table.c.model),
        (f.intents, table.c.intent),
        (f.sources, table.c.source),
    ):
        if values:
            conds.append(col.in_(values))
    return conds


def _rollup_range(since: float, until: float, filters: MonitorFilters | None, table=None):
    t = RequestRollup.__table__ if table is None else table
    return and_(t.c.minute >= _minute_floor(since), t.c.minute <= int(until), *_dimension_filter(filters, t))


def _i(v) -> int:
    # PostgreSQL returns SUM(bigint) as numeric (Decimal); SQLite as int.
    return int(v or 0)


def _f(v) -> float:
    return float(v or 0.0)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _cumsum(values: Iterable[float]) -> tuple[float, ...]:
    out, acc = [], 0.0
    for v in values:
        acc += v
        out.append(acc)
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# window_series: everything the monitor charts, in two queries
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Percentiles:
    """p50 / p95 / p99 in milliseconds per bucket (``None`` where a bucket has no samples)."""

    p50: tuple[float | None, ...]
    p95: tuple[float | None, ...]
    p99: tuple[float | None, ...]


@dataclass(frozen=True)
class ProviderSeries:
    """One provider's per-bucket series, aligned with :attr:`WindowSeries.buckets`, and its
    whole-window latency summary."""

    provider: str
    requests: tuple[int, ...]
    attempts: tuple[int, ...]
    errors: tuple[int, ...]  # failed attempts
    request_rate: tuple[float, ...]  # requests per second
    error_rate: tuple[float | None, ...]  # failed attempts / attempts
    latency: Percentiles
    ttft: Percentiles
    cost_usd: tuple[float, ...]
    cost_per_min: tuple[float, ...]
    cum_cost_usd: tuple[float, ...]  # running total from the window's start
    cached_ratio: tuple[float | None, ...]
    tokens_per_s: tuple[float, ...]  # completion tokens per second
    window_latency: tuple[float | None, float | None, float | None]  # p50, p95, p99 over the window
    window_ttft: tuple[float | None, float | None, float | None]


@dataclass(frozen=True)
class ModelSeries:
    """One model's requests and cost per bucket (all providers serving it summed)."""

    model: str
    requests: tuple[int, ...]
    cost_usd: tuple[float, ...]
    cost_per_min: tuple[float, ...]
    cum_cost_usd: tuple[float, ...]


@dataclass(frozen=True)
class Totals:
    """Whole-window sums over every provider and model that passed the filters."""

    requests: int = 0
    attempts: int = 0
    errors: int = 0
    request_errors: int = 0
    fallbacks: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    latency: tuple[float | None, float | None, float | None] = (None, None, None)
    ttft: tuple[float | None, float | None, float | None] = (None, None, None)

    @property
    def request_rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def error_rate(self) -> float | None:
        return _ratio(self.errors, self.attempts)

    @property
    def request_error_rate(self) -> float | None:
        return _ratio(self.request_errors, self.requests)

    @property
    def fallback_rate(self) -> float | None:
        return _ratio(self.fallbacks, self.requests)

    @property
    def cached_ratio(self) -> float | None:
        return _ratio(self.cached_tokens, self.prompt_tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class WindowSeries:
    """All monitor series for one window; every per-bucket tuple is aligned with ``buckets``.

    ``buckets`` are bucket start times (epoch seconds, UTC), ``step_s`` their width, ``seconds`` the
    part of each bucket inside the window. ``providers`` and ``models`` are keyed by name, sorted.
    Overall per-bucket series (all providers) are the ``request_rate`` ... ``tokens_per_s`` tuples.
    """

    since: float
    until: float
    step_s: int
    buckets: tuple[int, ...]
    seconds: tuple[float, ...]
    providers: Mapping[str, ProviderSeries]
    models: Mapping[str, ModelSeries]
    requests: tuple[int, ...]
    request_rate: tuple[float, ...]
    error_rate: tuple[float | None, ...]  # failed attempts / attempts, all providers
    request_error_rate: tuple[float | None, ...]  # failed requests / requests
    fallback_rate: tuple[float | None, ...]
    cost_per_min: tuple[float, ...]
    cum_cost_usd: tuple[float, ...]
    cached_ratio: tuple[float | None, ...]
    tokens_per_s: tuple[float, ...]
    totals: Totals = field(default_factory=Totals)

    @property
    def empty(self) -> bool:
        return self.totals.attempts == 0


def _sum_cols(names: Sequence[str], table=None) -> list:
    t = RequestRollup.__table__ if table is None else table
    return [func.sum(t.c[n]).label(n) for n in names]


def _bucket_expr(step: int, table=None):
    # The step is inlined (it is an int we computed): with a bound parameter PostgreSQL could not
    # tell that the SELECT and GROUP BY expressions are the same.
    t = RequestRollup.__table__ if table is None else table
    return (t.c.minute - t.c.minute % literal_column(str(int(step)), BigInteger)).label("bucket")


@dataclass(frozen=True, slots=True)
class _Cell:
    """One (bucket, provider or model) group as summed by SQL, with its percentiles worked out
    once (a settled bucket's cell is cached and reused on every refresh)."""

    counts: tuple[int, ...]  # _COUNTS order (models: only ``requests`` is filled)
    cost: float
    lat: tuple[int, ...] | None = None  # summed histogram, None when it has no samples
    ttft: tuple[int, ...] | None = None
    lat_q: tuple[float | None, ...] = (None, None, None)
    ttft_q: tuple[float | None, ...] = (None, None, None)


# bucket start -> ({provider: cell}, {model: cell})
_Buckets = dict[int, tuple[dict[str, _Cell], dict[str, _Cell]]]
_EMPTY_BUCKET: tuple[dict[str, _Cell], dict[str, _Cell]] = ({}, {})


def _quantiles(hist: Sequence[int] | None) -> tuple[float | None, ...]:
    if not hist:
        return (None,) * len(QUANTILES)
    return tuple(percentile(hist, q) for q in QUANTILES)


def _hist(values: Sequence) -> tuple[int, ...] | None:
    h = tuple(_i(v) for v in values)
    return h if any(h) else None


def _provider_cell(row: Sequence) -> _Cell:
    # row: bucket, provider, *_COUNTS, cost_usd, *LATENCY_BUCKETS, *TTFT_BUCKETS
    nc, nl = len(_COUNTS), len(LATENCY_BUCKETS)
    lat = _hist(row[3 + nc : 3 + nc + nl])
    ttft = _hist(row[3 + nc + nl :])
    return _Cell(
        counts=tuple(_i(v) for v in row[2 : 2 + nc]),
        cost=_f(row[2 + nc]),
        lat=lat,
        ttft=ttft,
        lat_q=_quantiles(lat),
        ttft_q=_quantiles(ttft),
    )


_REQ = _COUNTS.index("requests")


def _model_cell(row: Sequence) -> _Cell:
    # row: bucket, model, requests, cost_usd
    counts = [0] * len(_COUNTS)
    counts[_REQ] = _i(row[2])
    return _Cell(counts=tuple(counts), cost=_f(row[3]))


def _fetch(engine: Engine, lo: int, until: float, step: int, filters: MonitorFilters) -> _Buckets:
    """Two grouped scans of the rollups from bucket ``lo`` to ``until``: counters and histograms by
    (bucket, provider), requests and cost by (bucket, model). They read the coarsest rollup table
    whose span divides ``step`` (a 24-hour window in 5-minute steps sums 288 buckets, not 1,440)."""
    t = rollup_table_for(step)
    bucket = _bucket_expr(step, t)
    where = _rollup_range(lo, until, filters, t)
    by_provider = (
        select(
            bucket,
            t.c.provider,
            *_sum_cols((*_COUNTS, "cost_usd"), t),
            *_sum_cols(LATENCY_BUCKETS, t),
            *_sum_cols(TTFT_BUCKETS, t),
        )
        .where(where)
        .group_by(bucket, t.c.provider)
    )
    by_model = (
        select(bucket, t.c.model, *_sum_cols(("requests", "cost_usd"), t)).where(where).group_by(bucket, t.c.model)
    )
    out: _Buckets = {}
    with engine.connect() as conn:
        for row in conn.execute(by_provider):
            out.setdefault(int(row[0]), ({}, {}))[0][row[1]] = _provider_cell(row)
        for row in conn.execute(by_model):
            out.setdefault(int(row[0]), ({}, {}))[1][row[1]] = _model_cell(row)
    return out


class _SettledCache:
    """Per (database, step, filters): the cells of buckets that ended ``SETTLE_S`` before the
    window's end. Rollups of such minutes no longer change in practice (records are written within
    seconds of a request ending), so a live refresh only re-reads the last few buckets. Each entry
    is dropped ``TTL_S`` after it was first filled, so a late write or a cleared database shows up
    on the next full read; entries are bounded in number and pruned to the window."""

    SETTLE_S = 600
    TTL_S = 300.0
    MAX_KEYS = 64

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[float, _Buckets]] = OrderedDict()

    def get(self, key: tuple) -> _Buckets:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or time.monotonic() - hit[0] > self.TTL_S:
                self._entries.pop(key, None)
                return {}
            self._entries.move_to_end(key)
            return dict(hit[1])

    def put(self, key: tuple, settled: _Buckets, keep_from: int) -> None:
        with self._lock:
            created, old = self._entries.get(key, (time.monotonic(), {}))
            merged = {b: v for b, v in old.items() if b >= keep_from}
            merged.update(settled)
            self._entries[key] = (created, merged)
            self._entries.move_to_end(key)
            while len(self._entries) > self.MAX_KEYS:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHE = _SettledCache()


def clear_cache() -> None:
    """Forget every cached settled bucket (tests; after deleting or back-filling rollups)."""
    _CACHE.clear()


def _window_cells(
    engine: Engine, buckets: Sequence[int], step: int, until: float, filters: MonitorFilters, use_cache: bool
) -> _Buckets:
    key = (engine.url.render_as_string(hide_password=True), step, filters)
    known = _CACHE.get(key) if use_cache else {}
    missing = [b for b in buckets if b not in known]
    if not missing:
        return known
    fetched = _fetch(engine, missing[0], until, step, filters)
    fresh = {b: fetched.get(b, _EMPTY_BUCKET) for b in buckets if b >= missing[0]}
    if use_cache:
        settled_before = until - _SettledCache.SETTLE_S
        _CACHE.put(key, {b: v for b, v in fresh.items() if b + step <= settled_before}, buckets[0])
    known.update(fresh)
    return known


def _sum_hists(hists: Iterable[Sequence[int] | None], n: int) -> list[int]:
    total = [0] * n
    for h in hists:
        if h:
            total = [a + b for a, b in zip(total, h, strict=False)]
    return total


def _column(cells: Sequence[_Cell | None], name: str) -> list[int]:
    k = _COUNTS.index(name)
    return [c.counts[k] if c else 0 for c in cells]


def _provider_series(name: str, cells: Sequence[_Cell | None], secs: Sequence[float]) -> ProviderSeries:
    req, att, err = _column(cells, "requests"), _column(cells, "attempts"), _column(cells, "errors")
    prompt, cached = _column(cells, "prompt_tokens"), _column(cells, "cached_tokens")
    completion = _column(cells, "completion_tokens")
    cost = [c.cost if c else 0.0 for c in cells]
    none3 = (None, None, None)
    lat_q = [c.lat_q if c else none3 for c in cells]
    ttft_q = [c.ttft_q if c else none3 for c in cells]
    return ProviderSeries(
        provider=name,
        requests=tuple(req),
        attempts=tuple(att),
        errors=tuple(err),
        request_rate=tuple(r / s for r, s in zip(req, secs, strict=False)),
        error_rate=tuple(_ratio(e, a) for e, a in zip(err, att, strict=False)),
        latency=Percentiles(*(tuple(q[k] for q in lat_q) for k in range(3))),
        ttft=Percentiles(*(tuple(q[k] for q in ttft_q) for k in range(3))),
        cost_usd=tuple(cost),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs, strict=False)),
        cum_cost_usd=_cumsum(cost),
        cached_ratio=tuple(_ratio(k, p) for k, p in zip(cached, prompt, strict=False)),
        tokens_per_s=tuple(t / s for t, s in zip(completion, secs, strict=False)),
        window_latency=_quantiles(_sum_hists((c.lat for c in cells if c), len(LATENCY_BUCKETS))),
        window_ttft=_quantiles(_sum_hists((c.ttft for c in cells if c), len(TTFT_BUCKETS))),
    )


def _model_series(name: str, cells: Sequence[_Cell | None], secs: Sequence[float]) -> ModelSeries:
    cost = [c.cost if c else 0.0 for c in cells]
    return ModelSeries(
        model=name,
        requests=tuple(_column(cells, "requests")),
        cost_usd=tuple(cost),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs, strict=False)),
        cum_cost_usd=_cumsum(cost),
    )


def _by_name(cells: _Buckets, buckets: Sequence[int], side: int) -> dict[str, list[_Cell | None]]:
    names = sorted({n for b in buckets for n in cells.get(b, _EMPTY_BUCKET)[side]})
    return {n: [cells.get(b, _EMPTY_BUCKET)[side].get(n) for b in buckets] for n in names}


def window_series(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    step: int | None = None,
    use_cache: bool = True,
) -> WindowSeries:
    """Per-bucket series for the window ``[since, until]`` (epoch seconds).

    ``step`` (seconds, a multiple of 60) defaults to :func:`choose_step` of the window; the window
    is widened to start on a bucket boundary (see :func:`bucket_axis`). The rollups are read with
    two grouped queries (see :func:`_fetch`), and with ``use_cache`` only from the first bucket not
    yet settled and cached (see :class:`_SettledCache`). Overall series are sums over providers.
    """
    step = step or choose_step(until - since)
    if step <= 0 or step % 60:
        raise ValueError("step must be a positive whole number of minutes (in seconds)")
    buckets, secs = bucket_axis(since, until, step)
    cells = _window_cells(engine, buckets, step, until, filters or NO_FILTERS, use_cache)
    pcells, mcells = _by_name(cells, buckets, 0), _by_name(cells, buckets, 1)
    providers = {n: _provider_series(n, c, secs) for n, c in pcells.items()}
    models = {n: _model_series(n, c, secs) for n, c in mcells.items()}
    return _assemble(buckets[0], until, step, buckets, secs, pcells, providers, models)


def _assemble(
    since: float,
    until: float,
    step: int,
    buckets: tuple[int, ...],
    secs: tuple[float, ...],
    pcells: Mapping[str, Sequence[_Cell | None]],
    providers: dict[str, ProviderSeries],
    models: dict[str, ModelSeries],
) -> WindowSeries:
    n = len(buckets)
    tot = {c: [0] * n for c in _COUNTS}
    cost = [0.0] * n
    for cells in pcells.values():
        for c in _COUNTS:
            tot[c] = [x + y for x, y in zip(tot[c], _column(cells, c), strict=False)]
        cost = [x + (c.cost if c else 0.0) for x, c in zip(cost, cells, strict=False)]
    all_cells = [c for cells in pcells.values() for c in cells if c]
    totals = Totals(
        **{c: sum(tot[c]) for c in _COUNTS},
        cost_usd=sum(cost),
        seconds=float(sum(secs)),
        latency=_quantiles(_sum_hists((c.lat for c in all_cells), len(LATENCY_BUCKETS))),
        ttft=_quantiles(_sum_hists((c.ttft for c in all_cells), len(TTFT_BUCKETS))),
    )
    return WindowSeries(
        since=since,
        until=until,
        step_s=step,
        buckets=buckets,
        seconds=secs,
        providers=providers,
        models=models,
        requests=tuple(tot["requests"]),
        request_rate=tuple(r / s for r, s in zip(tot["requests"], secs, strict=False)),
        error_rate=tuple(_ratio(e, a) for e, a in zip(tot["errors"], tot["attempts"], strict=False)),
        request_error_rate=tuple(_ratio(e, r) for e, r in zip(tot["request_errors"], tot["requests"], strict=False)),
        fallback_rate=tuple(_ratio(f, r) for f, r in zip(tot["fallbacks"], tot["requests"], strict=False)),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs, strict=False)),
        cum_cost_usd=_cumsum(cost),
        cached_ratio=tuple(_ratio(k, p) for k, p in zip(tot["cached_tokens"], tot["prompt_tokens"], strict=False)),
        tokens_per_s=tuple(t / s for t, s in zip(tot["completion_tokens"], secs, strict=False)),
        totals=totals,
    )


# ---------------------------------------------------------------------------------------------
# Overview KPIs and provider health
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverviewStats:
    """Headline numbers for the last ``window_s`` seconds (rounded out to whole rollup minutes).

    ``errors`` / ``error_rate`` are request-level (failed final attempts / requests): what callers
    saw. ``p50_ms`` / ``p95_ms`` are per-attempt latency over every provider, because the rollup
    histograms hold attempts; most requests succeed on their first attempt, where the two agree.
    ``tokens`` = prompt + completion tokens in the window. ``cost_today_usd`` covers the UTC day so
    far (since 00:00 UTC), independent of the window.
    """

    window_s: int
    requests: int
    attempts: int
    errors: int
    error_rate: float | None
    fallbacks: int
    fallback_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    ttft_p50_ms: float | None
    tokens: int
    cached_ratio: float | None
    cost_window_usd: float
    cost_today_usd: float


def _utc_midnight(now: float) -> int:
    return int(now // 86400) * 86400


def overview_stats(engine: Engine, *, now: float, window_s: int = 900) -> OverviewStats:
    """Headline KPIs from the rollups: one window query plus one for today's cost."""
    t = RequestRollup.__table__
    since = now - window_s
    q = select(*_sum_cols((*_COUNTS, "cost_usd")), *_sum_cols(LATENCY_BUCKETS), *_sum_cols(TTFT_BUCKETS)).where(
        _rollup_range(since, now, None)
    )
    today = select(func.coalesce(func.sum(t.c.cost_usd), 0.0)).where(
        t.c.minute >= _utc_midnight(now), t.c.minute <= int(now)
    )
    with engine.connect() as conn:
        row = conn.execute(q).one()
        cost_today = _f(conn.execute(today).scalar_one())
    nl = len(LATENCY_BUCKETS)
    lat = [_i(v) for v in row[len(_COUNTS) + 1 : len(_COUNTS) + 1 + nl]]
    ttft = [_i(v) for v in row[len(_COUNTS) + 1 + nl :]]
    requests, req_err, fallbacks = _i(row.requests), _i(row.request_errors), _i(row.fallbacks)
    return OverviewStats(
        window_s=int(window_s),
        requests=requests,
        attempts=_i(row.attempts),
        errors=req_err,
        error_rate=_ratio(req_err, requests),
        fallbacks=fallbacks,
        fallback_rate=_ratio(fallbacks, requests),
        p50_ms=percentile(lat, 0.5),
        p95_ms=percentile(lat, 0.95),
        ttft_p50_ms=percentile(ttft, 0.5),
        tokens=_i(row.prompt_tokens) + _i(row.completion_tokens),
        cached_ratio=_ratio(_i(row.cached_tokens), _i(row.prompt_tokens)),
        cost_window_usd=_f(row.cost_usd),
        cost_today_usd=cost_today,
    )


@dataclass(frozen=True)
class ProviderHealth:
    """A provider's attempts in the last ``window_s`` seconds (whole rollup minutes).

    ``error_rate`` = failed attempts / attempts (``None`` with no attempts). ``last_error_class`` and
    ``last_error_at`` describe its newest failed attempt within the window, if any.
    """

    provider: str
    attempts: int
    errors: int
    error_rate: float | None
    requests: int
    p50_ms: float | None
    p95_ms: float | None
    last_error_class: str | None = None
    last_error_at: float | None = None


def provider_health(
    engine: Engine, *, providers: list[str], now: float, window_s: int = 300
) -> dict[str, ProviderHealth]:
    """Health of each named provider (every name gets an entry, zeros when idle).

    One grouped rollup query; then, only for providers that had errors, one ``ts``-indexed lookup of
    their newest failed attempt, bounded to the window.
    """
    t = RequestRollup.__table__
    since = now - window_s
    q = (
        select(t.c.provider, *_sum_cols(("attempts", "errors", "requests")), *_sum_cols(LATENCY_BUCKETS))
        .where(_rollup_range(since, now, MonitorFilters(providers=tuple(providers))))
        .group_by(t.c.provider)
    )
    out: dict[str, ProviderHealth] = {}
    with engine.connect() as conn:
        rows = {r.provider: r for r in conn.execute(q).all()} if providers else {}
        for name in providers:
            r = rows.get(name)
            if r is None:
                out[name] = ProviderHealth(name, 0, 0, None, 0, None, None)
                continue
            lat = [_i(v) for v in r[4:]]
            attempts, errors = _i(r.attempts), _i(r.errors)
            last = _last_error(conn, name, _minute_floor(since), now) if errors else None
            out[name] = ProviderHealth(
                name,
                attempts,
                errors,
                _ratio(errors, attempts),
                _i(r.requests),
                percentile(lat, 0.5),
                percentile(lat, 0.95),
                last_error_class=last[0] if last else None,
                last_error_at=last[1] if last else None,
            )
    return out


def _last_error(conn: Connection, provider: str, since: float, now: float) -> tuple[str | None, float] | None:
    log = RequestLog.__table__
    q = (
        select(log.c.error_class, log.c.ts)
        .where(log.c.ts >= since, log.c.ts <= now + 60, log.c.provider == provider, log.c.status != "ok")
        .order_by(log.c.ts.desc())
        .limit(1)
    )
    row = conn.execute(q).first()
    return (row.error_class, float(row.ts)) if row else None


# ---------------------------------------------------------------------------------------------
# Canary: observed split
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitPoint:
    """Final requests in one bucket by the canary side they were assigned to.

    ``ts`` is the bucket start (epoch seconds), ``step_s`` its width; ``primary_share`` =
    primary / (primary + fallback), ``None`` when the bucket had no requests.
    """

    ts: int
    step_s: int
    primary: int
    fallback: int

    @property
    def total(self) -> int:
        return self.primary + self.fallback

    @property
    def primary_share(self) -> float | None:
        return _ratio(self.primary, self.total)


def observed_split(engine: Engine, *, now: float, minutes: int) -> list[SplitPoint]:
    """Requests per bucket and canary side over the last ``minutes`` minutes, oldest first.

    Buckets are one minute wide unless that would exceed :data:`MAX_POINTS`; every bucket of the
    window is present (zeros when idle), the last one being the minute in progress.
    """
    t = RequestRollup.__table__
    since = now - max(int(minutes), 1) * 60 + 60  # ``minutes`` minutes including the current one
    step = choose_step(now - since)
    buckets, _ = bucket_axis(since, now, step)
    bucket = _bucket_expr(step)
    q = (
        select(bucket, t.c.side, func.sum(t.c.requests).label("requests"))
        .where(_rollup_range(since, now, None))
        .group_by(bucket, t.c.side)
    )
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    counts: dict[int, list[int]] = {b: [0, 0] for b in buckets}
    for r in rows:
        slot = counts.get(int(r.bucket))
        if slot is not None:
            slot[0 if r.side == "primary" else 1] += _i(r.requests)
    return [SplitPoint(b, step, p, f) for b, (p, f) in counts.items()]


# ---------------------------------------------------------------------------------------------
# Raw rows: recent requests, CSV, cheap checks, filter choices
# ---------------------------------------------------------------------------------------------


def _time_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def recent_requests(
    engine: Engine,
    *,
    limit: int = 200,
    filters: MonitorFilters | None = None,
    include_prompt: bool = False,
    since: float | None = None,
) -> list[dict]:
    """The newest attempt rows of ``request_log``, newest first, as dicts keyed by
    :data:`RECENT_COLUMNS` (plus ``prompt_text`` only when ``include_prompt``).

    Each attempt is a row (``attempt`` numbers them, ``final`` marks the one the caller got), so
    retries and fallbacks are visible. ``time_utc`` is an ISO-8601 UTC string of ``ts``.
    """
    log = RequestLog.__table__
    limit = max(0, min(int(limit), RECENT_LIMIT_MAX))
    cols = [log.c[c] for c in RECENT_COLUMNS if c != "time_utc"]
    if include_prompt:
        cols.append(log.c.prompt_text)
    conds = _dimension_filter(filters, log)
    if since is not None:
        conds.append(log.c.ts >= since)
    q = select(*cols).where(*conds).order_by(log.c.ts.desc(), log.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        rows = conn.execute(q).mappings().all()
    out = []
    for r in rows:
        d = {"time_utc": _time_utc(r["ts"])}
        d.update(r)
        out.append(d)
    return out


def requests_csv(rows: Sequence[Mapping]) -> str:
    """``rows`` (from :func:`recent_requests`) as CSV text with a header row; ``None`` is empty."""
    buf = io.StringIO()
    header = list(rows[0].keys()) if rows else list(RECENT_COLUMNS)
    w = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def has_requests(engine: Engine) -> bool:
    """Whether anything was ever logged (one row probe)."""
    with engine.connect() as conn:
        return conn.execute(select(RequestRollup.minute).limit(1)).first() is not None


def filter_options(engine: Engine, *, since: float) -> dict[str, list[str]]:
    """Distinct ``providers``, ``models``, ``intents`` and ``sources`` with traffic since ``since``.

    Whole hours come from the hourly rollups and only the partial hour at the window's start from
    the per-minute ones, so a 7-day window reads about 170 hourly buckets of combinations, not
    10,080 minutes' worth.
    """
    first_hour = -(-int(since) // 3600) * 3600  # the first hour boundary at or after ``since``
    minutes, hours = RequestRollup.__table__, rollup_table_for(3600)
    queries = [
        select(minutes.c.provider, minutes.c.model, minutes.c.intent, minutes.c.source)
        .distinct()
        .where(minutes.c.minute >= _minute_floor(since), minutes.c.minute < first_hour),
        select(hours.c.provider, hours.c.model, hours.c.intent, hours.c.source)
        .distinct()
        .where(hours.c.minute >= first_hour),
    ]
    out: dict[str, set[str]] = {"providers": set(), "models": set(), "intents": set(), "sources": set()}
    with engine.connect() as conn:
        for q in queries:
            for r in conn.execute(q):
                out["providers"].add(r.provider)
                out["models"].add(r.model)
                out["intents"].add(r.intent)
                out["sources"].add(r.source)
    return {k: sorted(v) for k, v in out.items()}


@dataclass(frozen=True)
class GuardrailReading:
    """A provider's attempts and failed attempts over the guardrail's window."""

    attempts: int
    errors: int

    @property
    def error_rate(self) -> float:
        return self.errors / self.attempts if self.attempts else 0.0


def provider_error_rate(
    engine: Engine, provider: str, window_minutes: int, now: float | None = None
) -> GuardrailReading:
    """Attempts and failures of ``provider`` in the last ``window_minutes`` minutes (the current
    minute included), from the per-minute rollups."""
    now = time.time() if now is None else now
    since = _minute_floor(now) - (window_minutes - 1) * 60
    t = RequestRollup.__table__
    q = select(func.coalesce(func.sum(t.c.attempts), 0), func.coalesce(func.sum(t.c.errors), 0)).where(
        t.c.provider == provider, t.c.minute >= since
    )
    with engine.connect() as conn:
        attempts, errors = conn.execute(q).one()
    return GuardrailReading(_i(attempts), _i(errors))
