"""Read-side SQL for the dashboards: time series, KPIs, provider health, canary split, recent rows.

Everything that charts or summarises traffic reads the per-minute ``request_rollup`` table, never the
raw log, so the cost of a query depends on the window's minutes and dimensions, not on the request
volume. The raw ``request_log`` is read only for bounded, index-ordered lookups (the newest rows, a
provider's latest error).

Time bucketing: a rollup's ``minute`` is the integer epoch second of the minute's start. A window
is cut into buckets of ``step`` seconds (a whole number of minutes chosen by :func:`choose_step` so
any window has at most :data:`MAX_POINTS` buckets); the bucket of a row is ``minute - minute % step``,
computed in SQL, and the counters and histogram columns are summed per bucket and dimension there.
Percentiles come from the summed histogram counts via :func:`app.telemetry.histogram.percentile`,
so they are accurate to the histogram's resolution (about 15 %, usually much better).

Definitions used throughout (they follow the rollup's counters):

* requests = final attempts; attempts = every attempt including retries and fallbacks.
* error rate (per provider) = failed attempts / attempts on that provider: what that upstream did.
* request error rate = failed final attempts / requests: what callers saw.
* fallback rate = final attempts served by the fallback route / requests.
* latency and TTFT percentiles are per attempt (the rollup histograms hold every attempt).
* cached ratio = cached prompt tokens / prompt tokens.
* tokens/s = completion (output) tokens per second of wall-clock time: throughput.

Rates divide by the seconds a bucket actually covers inside the window (the first bucket may start
before the window and the current one is still in progress), so partial buckets do not dip.
Results are frozen dataclasses of tuples, safe to cache and share between threads.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import BigInteger, Connection, Engine, and_, func, literal_column, select

from app.telemetry.histogram import percentile
from db.models import LATENCY_BUCKETS, TTFT_BUCKETS, RequestLog, RequestRollup

MAX_POINTS = 300
# Steps a chart is cut into, in minutes: round numbers an operator reads at a glance.
NICE_STEPS_MIN = (1, 2, 3, 5, 10, 15, 20, 30, 60, 120, 180, 360, 720, 1440)
QUANTILES = (0.50, 0.95, 0.99)
RECENT_LIMIT_MAX = 5000

_COUNTS = ("attempts", "requests", "errors", "request_errors", "fallbacks",
           "prompt_tokens", "cached_tokens", "completion_tokens")

# Operator-facing columns of the recent-requests table, in display order. prompt_text is opt-in.
RECENT_COLUMNS = (
    "time_utc", "request_id", "attempt", "final", "provider", "model", "requested_model", "intent",
    "side", "source", "status", "http_status", "error_class", "error_message", "latency_ms", "ttft_ms",
    "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd", "fallback", "substituted",
    "stream", "session_id", "ts",
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
    """Bucket starts covering ``[since, until]`` and the seconds of each inside the window.

    The window starts at the minute holding ``since`` (the rollups' resolution) and ends at
    ``until``, which may fall inside a minute that is still being written.
    """
    lo = _minute_floor(since)
    hi = max(until, lo + 1.0)
    first = lo - lo % step
    last = _minute_floor(hi)
    last -= last % step
    starts = tuple(range(first, last + 1, step))
    covered = tuple(max(min(b + step, hi) - max(b, lo), 1.0) for b in starts)
    return starts, covered


def _dimension_filter(filters: MonitorFilters | None, table) -> list:
    f = filters or NO_FILTERS
    conds = []
    for values, col in ((f.providers, table.c.provider), (f.models, table.c.model),
                        (f.intents, table.c.intent), (f.sources, table.c.source)):
        if values:
            conds.append(col.in_(values))
    return conds


def _rollup_range(since: float, until: float, filters: MonitorFilters | None):
    t = RequestRollup.__table__
    return and_(t.c.minute >= _minute_floor(since), t.c.minute <= int(until),
                *_dimension_filter(filters, t))


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
    errors: tuple[int, ...]                    # failed attempts
    request_rate: tuple[float, ...]            # requests per second
    error_rate: tuple[float | None, ...]       # failed attempts / attempts
    latency: Percentiles
    ttft: Percentiles
    cost_usd: tuple[float, ...]
    cost_per_min: tuple[float, ...]
    cum_cost_usd: tuple[float, ...]            # running total from the window's start
    cached_ratio: tuple[float | None, ...]
    tokens_per_s: tuple[float, ...]            # completion tokens per second
    window_latency: tuple[float | None, float | None, float | None]   # p50, p95, p99 over the window
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
    error_rate: tuple[float | None, ...]          # failed attempts / attempts, all providers
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


def _sum_cols(names: Sequence[str]) -> list:
    t = RequestRollup.__table__
    return [func.sum(t.c[n]).label(n) for n in names]


def _bucket_expr(step: int):
    # The step is inlined (it is an int we computed): with a bound parameter PostgreSQL could not
    # tell that the SELECT and GROUP BY expressions are the same.
    t = RequestRollup.__table__
    return (t.c.minute - t.c.minute % literal_column(str(int(step)), BigInteger)).label("bucket")


def _provider_rows(conn: Connection, since: float, until: float, step: int,
                   filters: MonitorFilters | None) -> list:
    t = RequestRollup.__table__
    bucket = _bucket_expr(step)
    q = (select(bucket, t.c.provider, *_sum_cols(_COUNTS + ("cost_usd",)),
                *_sum_cols(LATENCY_BUCKETS), *_sum_cols(TTFT_BUCKETS))
         .where(_rollup_range(since, until, filters))
         .group_by(bucket, t.c.provider))
    return conn.execute(q).all()


def _model_rows(conn: Connection, since: float, until: float, step: int,
                filters: MonitorFilters | None) -> list:
    t = RequestRollup.__table__
    bucket = _bucket_expr(step)
    q = (select(bucket, t.c.model, *_sum_cols(("requests", "cost_usd")))
         .where(_rollup_range(since, until, filters))
         .group_by(bucket, t.c.model))
    return conn.execute(q).all()


def _percentiles(hists: Sequence[Sequence[int] | None]) -> Percentiles:
    cols: list[list[float | None]] = [[], [], []]
    for h in hists:
        for k, q in enumerate(QUANTILES):
            cols[k].append(percentile(h, q) if h else None)
    return Percentiles(*(tuple(c) for c in cols))


def _summary(hist: Sequence[int]) -> tuple[float | None, float | None, float | None]:
    return tuple(percentile(hist, q) for q in QUANTILES)  # type: ignore[return-value]


class _Acc:
    """Per-dimension accumulator of summed rows, aligned to the bucket axis."""

    def __init__(self, n: int):
        self.counts = {c: [0] * n for c in _COUNTS}
        self.cost = [0.0] * n
        self.lat: list[list[int] | None] = [None] * n
        self.ttft: list[list[int] | None] = [None] * n

    def add(self, i: int, row, with_hist: bool) -> None:
        for c in _COUNTS:
            v = getattr(row, c, None)
            if v is not None:
                self.counts[c][i] += _i(v)
        self.cost[i] += _f(row.cost_usd)
        if with_hist:
            self.lat[i] = _add_hist(self.lat[i], row[-2 * len(LATENCY_BUCKETS):-len(TTFT_BUCKETS)])
            self.ttft[i] = _add_hist(self.ttft[i], row[-len(TTFT_BUCKETS):])


def _add_hist(acc: list[int] | None, values: Sequence) -> list[int] | None:
    vals = [_i(v) for v in values]
    if acc is None:
        return vals if any(vals) else None
    return [a + b for a, b in zip(acc, vals)]


def _sum_hists(hists: Iterable[Sequence[int] | None], n: int) -> list[int]:
    total = [0] * n
    for h in hists:
        if h:
            for j, v in enumerate(h):
                total[j] += v
    return total


def _provider_series(name: str, acc: _Acc, secs: Sequence[float]) -> ProviderSeries:
    c = acc.counts
    return ProviderSeries(
        provider=name,
        requests=tuple(c["requests"]),
        attempts=tuple(c["attempts"]),
        errors=tuple(c["errors"]),
        request_rate=tuple(r / s for r, s in zip(c["requests"], secs)),
        error_rate=tuple(_ratio(e, a) for e, a in zip(c["errors"], c["attempts"])),
        latency=_percentiles(acc.lat),
        ttft=_percentiles(acc.ttft),
        cost_usd=tuple(acc.cost),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(acc.cost, secs)),
        cum_cost_usd=_cumsum(acc.cost),
        cached_ratio=tuple(_ratio(k, p) for k, p in zip(c["cached_tokens"], c["prompt_tokens"])),
        tokens_per_s=tuple(t / s for t, s in zip(c["completion_tokens"], secs)),
        window_latency=_summary(_sum_hists(acc.lat, len(LATENCY_BUCKETS))),
        window_ttft=_summary(_sum_hists(acc.ttft, len(TTFT_BUCKETS))),
    )


def _model_series(name: str, acc: _Acc, secs: Sequence[float]) -> ModelSeries:
    return ModelSeries(model=name, requests=tuple(acc.counts["requests"]), cost_usd=tuple(acc.cost),
                       cost_per_min=tuple(v * 60.0 / s for v, s in zip(acc.cost, secs)),
                       cum_cost_usd=_cumsum(acc.cost))


def _fold(rows: Sequence, index: Mapping[int, int], n: int, *, with_hist: bool) -> dict[str, _Acc]:
    accs: dict[str, _Acc] = {}
    for row in rows:
        i = index.get(int(row.bucket))
        if i is None:  # cannot happen with the window filter; guards a clock step
            continue
        accs.setdefault(row[1], _Acc(n)).add(i, row, with_hist)
    return dict(sorted(accs.items()))


def window_series(engine: Engine, *, since: float, until: float,
                  filters: MonitorFilters | None = None, step: int | None = None) -> WindowSeries:
    """Per-bucket series for ``[since, until]`` (epoch seconds) with two rollup queries.

    ``step`` (seconds, a multiple of 60) defaults to :func:`choose_step` of the window. One query
    groups counters and histograms by (bucket, provider); the other groups requests and cost by
    (bucket, model). Overall series are sums of the provider series.
    """
    step = step or choose_step(until - since)
    if step % 60:
        raise ValueError("step must be a whole number of minutes (in seconds)")
    buckets, secs = bucket_axis(since, until, step)
    index = {b: i for i, b in enumerate(buckets)}
    n = len(buckets)
    with engine.connect() as conn:
        prow = _provider_rows(conn, since, until, step, filters)
        mrow = _model_rows(conn, since, until, step, filters)
    paccs = _fold(prow, index, n, with_hist=True)
    maccs = _fold(mrow, index, n, with_hist=False)
    providers = {name: _provider_series(name, a, secs) for name, a in paccs.items()}
    models = {name: _model_series(name, a, secs) for name, a in maccs.items()}
    return _assemble(since, until, step, buckets, secs, paccs, providers, models)


def _assemble(since, until, step, buckets, secs, paccs: Mapping[str, _Acc],
              providers: dict[str, ProviderSeries], models: dict[str, ModelSeries]) -> WindowSeries:
    n = len(buckets)
    tot = {c: [0] * n for c in _COUNTS}
    cost = [0.0] * n
    for a in paccs.values():
        for c in _COUNTS:
            tot[c] = [x + y for x, y in zip(tot[c], a.counts[c])]
        cost = [x + y for x, y in zip(cost, a.cost)]
    totals = Totals(
        **{c: sum(tot[c]) for c in _COUNTS}, cost_usd=sum(cost), seconds=float(sum(secs)),
        latency=_summary(_sum_hists((h for a in paccs.values() for h in a.lat), len(LATENCY_BUCKETS))),
        ttft=_summary(_sum_hists((h for a in paccs.values() for h in a.ttft), len(TTFT_BUCKETS))),
    )
    return WindowSeries(
        since=since, until=until, step_s=step, buckets=buckets, seconds=secs,
        providers=providers, models=models,
        requests=tuple(tot["requests"]),
        request_rate=tuple(r / s for r, s in zip(tot["requests"], secs)),
        error_rate=tuple(_ratio(e, a) for e, a in zip(tot["errors"], tot["attempts"])),
        request_error_rate=tuple(_ratio(e, r) for e, r in zip(tot["request_errors"], tot["requests"])),
        fallback_rate=tuple(_ratio(f, r) for f, r in zip(tot["fallbacks"], tot["requests"])),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs)),
        cum_cost_usd=_cumsum(cost),
        cached_ratio=tuple(_ratio(k, p) for k, p in zip(tot["cached_tokens"], tot["prompt_tokens"])),
        tokens_per_s=tuple(t / s for t, s in zip(tot["completion_tokens"], secs)),
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
    q = select(*_sum_cols(_COUNTS + ("cost_usd",)), *_sum_cols(LATENCY_BUCKETS), *_sum_cols(TTFT_BUCKETS)
               ).where(_rollup_range(since, now, None))
    today = select(func.coalesce(func.sum(t.c.cost_usd), 0.0)).where(
        t.c.minute >= _utc_midnight(now), t.c.minute <= int(now))
    with engine.connect() as conn:
        row = conn.execute(q).one()
        cost_today = _f(conn.execute(today).scalar_one())
    nl = len(LATENCY_BUCKETS)
    lat = [_i(v) for v in row[len(_COUNTS) + 1:len(_COUNTS) + 1 + nl]]
    ttft = [_i(v) for v in row[len(_COUNTS) + 1 + nl:]]
    requests, req_err, fallbacks = _i(row.requests), _i(row.request_errors), _i(row.fallbacks)
    return OverviewStats(
        window_s=int(window_s), requests=requests, attempts=_i(row.attempts), errors=req_err,
        error_rate=_ratio(req_err, requests), fallbacks=fallbacks, fallback_rate=_ratio(fallbacks, requests),
        p50_ms=percentile(lat, 0.5), p95_ms=percentile(lat, 0.95), ttft_p50_ms=percentile(ttft, 0.5),
        tokens=_i(row.prompt_tokens) + _i(row.completion_tokens),
        cached_ratio=_ratio(_i(row.cached_tokens), _i(row.prompt_tokens)),
        cost_window_usd=_f(row.cost_usd), cost_today_usd=cost_today,
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


def provider_health(engine: Engine, *, providers: list[str], now: float,
                    window_s: int = 300) -> dict[str, ProviderHealth]:
    """Health of each named provider (every name gets an entry, zeros when idle).

    One grouped rollup query; then, only for providers that had errors, one ``ts``-indexed lookup of
    their newest failed attempt, bounded to the window.
    """
    t = RequestRollup.__table__
    since = now - window_s
    q = (select(t.c.provider, *_sum_cols(("attempts", "errors", "requests")), *_sum_cols(LATENCY_BUCKETS))
         .where(_rollup_range(since, now, MonitorFilters(providers=tuple(providers))))
         .group_by(t.c.provider))
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
                name, attempts, errors, _ratio(errors, attempts), _i(r.requests),
                percentile(lat, 0.5), percentile(lat, 0.95),
                last_error_class=last[0] if last else None, last_error_at=last[1] if last else None)
    return out


def _last_error(conn: Connection, provider: str, since: float, now: float) -> tuple[str | None, float] | None:
    log = RequestLog.__table__
    q = (select(log.c.error_class, log.c.ts)
         .where(log.c.ts >= since, log.c.ts <= now + 60, log.c.provider == provider, log.c.status != "ok")
         .order_by(log.c.ts.desc()).limit(1))
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
    q = (select(bucket, t.c.side, func.sum(t.c.requests).label("requests"))
         .where(_rollup_range(since, now, None)).group_by(bucket, t.c.side))
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


def recent_requests(engine: Engine, *, limit: int = 200, filters: MonitorFilters | None = None,
                    include_prompt: bool = False, since: float | None = None) -> list[dict]:
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
    """Distinct ``providers``, ``models``, ``intents`` and ``sources`` with traffic since ``since``."""
    t = RequestRollup.__table__
    q = (select(t.c.provider, t.c.model, t.c.intent, t.c.source).distinct()
         .where(t.c.minute >= _minute_floor(since)))
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    out = {"providers": set(), "models": set(), "intents": set(), "sources": set()}
    for r in rows:
        out["providers"].add(r.provider)
        out["models"].add(r.model)
        out["intents"].add(r.intent)
        out["sources"].add(r.source)
    return {k: sorted(v) for k, v in out.items()}
