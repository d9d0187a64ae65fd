"""The monitor's time series: a window cut into buckets, the summed rollup cells of
:mod:`db.monitor` turned into per-bucket rates, ratios, percentiles and running totals, and a small
cache of settled buckets so a live refresh re-reads only the newest ones.

A window is cut into buckets of ``step`` seconds (a whole number of minutes chosen by
:func:`choose_step` so any window has at most :data:`MAX_POINTS` buckets). Percentiles come from the
summed histogram counts via :func:`core.histogram.percentile`, so they are accurate to the
histogram's resolution (about 15 %, usually much better).

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
before the window's end are kept in a small in-process cache (:class:`SettledCache`, refreshed in
full every five minutes of its clock; :mod:`app.monitor.cache`). Results are frozen dataclasses of
tuples, safe to cache and share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import Engine

from app.monitor.cache import SETTLED, SettledCache
from core.histogram import percentiles
from db.models import LATENCY_BUCKETS, TTFT_BUCKETS
from db.monitor import COUNT_COLUMNS, NO_FILTERS, BucketCells, MonitorFilters, SummedCell, bucket_cells

MAX_POINTS = 300
# Steps a chart is cut into, in minutes: round numbers an operator reads at a glance.
NICE_STEPS_MIN = (1, 2, 3, 5, 10, 15, 20, 30, 60, 120, 180, 360, 720, 1440)
QUANTILES = (0.50, 0.95, 0.99)


def choose_step(window_s: float, max_points: int = MAX_POINTS) -> int:
    """Bucket width in seconds: the smallest round number of minutes that cuts ``window_s`` into at
    most ``max_points`` buckets (two are reserved for a first and last bucket cut by the window)."""
    minutes = max(window_s, 60.0) / 60.0
    for step in NICE_STEPS_MIN:
        if minutes / step + 2 <= max_points:
            return step * 60
    days = math.ceil(minutes / (max_points - 2) / 1440)
    return days * 1440 * 60


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


def ratio(num: float, den: float) -> float | None:
    """``num / den``, ``None`` when there is nothing to divide by."""
    return num / den if den else None


def quantiles(hist: Sequence[int] | None) -> tuple[float | None, float | None, float | None]:
    """p50 / p95 / p99 of a summed histogram (``None`` each when it has no samples)."""
    if not hist:
        return (None, None, None)
    p50, p95, p99 = percentiles(hist, QUANTILES)
    return p50, p95, p99


def _cumsum(values: Iterable[float]) -> tuple[float, ...]:
    out, acc = [], 0.0
    for v in values:
        acc += v
        out.append(acc)
    return tuple(out)


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
        return ratio(self.errors, self.attempts)

    @property
    def request_error_rate(self) -> float | None:
        return ratio(self.request_errors, self.requests)

    @property
    def fallback_rate(self) -> float | None:
        return ratio(self.fallbacks, self.requests)

    @property
    def cached_ratio(self) -> float | None:
        return ratio(self.cached_tokens, self.prompt_tokens)

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


@dataclass(frozen=True, slots=True)
class _Cell:
    """A summed cell with its percentiles worked out once (a settled bucket's cell is cached and
    reused on every refresh)."""

    sums: SummedCell
    lat_q: tuple[float | None, ...]
    ttft_q: tuple[float | None, ...]

    @classmethod
    def of(cls, sums: SummedCell) -> _Cell:
        return cls(sums, quantiles(sums.lat), quantiles(sums.ttft))


# bucket start -> ({provider: cell}, {model: cell})
_Buckets = dict[int, tuple[dict[str, _Cell], dict[str, _Cell]]]
_EMPTY_BUCKET: tuple[dict[str, _Cell], dict[str, _Cell]] = ({}, {})


def _with_quantiles(cells: BucketCells) -> _Buckets:
    return {
        b: ({n: _Cell.of(c) for n, c in by_provider.items()}, {n: _Cell.of(c) for n, c in by_model.items()})
        for b, (by_provider, by_model) in cells.items()
    }


def _window_cells(
    engine: Engine,
    buckets: Sequence[int],
    step: int,
    until: float,
    filters: MonitorFilters,
    cache: SettledCache | None,
) -> _Buckets:
    key = (engine.url.render_as_string(hide_password=True), step, filters)
    known = cache.get(key) if cache is not None else {}
    missing = [b for b in buckets if b not in known]
    if not missing:
        return known
    fetched = _with_quantiles(bucket_cells(engine, since=missing[0], until=until, step=step, filters=filters))
    fresh = {b: fetched.get(b, _EMPTY_BUCKET) for b in buckets if b >= missing[0]}
    if cache is not None:
        settled_before = until - SettledCache.SETTLE_S
        cache.put(key, {b: v for b, v in fresh.items() if b + step <= settled_before}, buckets[0])
    known.update(fresh)
    return known


def _sum_hists(hists: Iterable[Sequence[int] | None], n: int) -> list[int]:
    rows = [h for h in hists if h]
    if not rows:
        return [0] * n
    return [int(v) for v in np.asarray(rows, dtype=np.int64).sum(axis=0)]


def _column(cells: Sequence[_Cell | None], name: str) -> list[int]:
    k = COUNT_COLUMNS.index(name)
    return [c.sums.counts[k] if c else 0 for c in cells]


def _costs(cells: Sequence[_Cell | None]) -> list[float]:
    return [c.sums.cost if c else 0.0 for c in cells]


def _provider_series(name: str, cells: Sequence[_Cell | None], secs: Sequence[float]) -> ProviderSeries:
    req, att, err = _column(cells, "requests"), _column(cells, "attempts"), _column(cells, "errors")
    prompt, cached = _column(cells, "prompt_tokens"), _column(cells, "cached_tokens")
    completion = _column(cells, "completion_tokens")
    cost = _costs(cells)
    none3 = (None, None, None)
    lat_q = [c.lat_q if c else none3 for c in cells]
    ttft_q = [c.ttft_q if c else none3 for c in cells]
    return ProviderSeries(
        provider=name,
        requests=tuple(req),
        attempts=tuple(att),
        errors=tuple(err),
        request_rate=tuple(r / s for r, s in zip(req, secs, strict=False)),
        error_rate=tuple(ratio(e, a) for e, a in zip(err, att, strict=False)),
        latency=Percentiles(*(tuple(q[k] for q in lat_q) for k in range(3))),
        ttft=Percentiles(*(tuple(q[k] for q in ttft_q) for k in range(3))),
        cost_usd=tuple(cost),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs, strict=False)),
        cum_cost_usd=_cumsum(cost),
        cached_ratio=tuple(ratio(k, p) for k, p in zip(cached, prompt, strict=False)),
        tokens_per_s=tuple(t / s for t, s in zip(completion, secs, strict=False)),
        window_latency=quantiles(_sum_hists((c.sums.lat for c in cells if c), len(LATENCY_BUCKETS))),
        window_ttft=quantiles(_sum_hists((c.sums.ttft for c in cells if c), len(TTFT_BUCKETS))),
    )


def _model_series(name: str, cells: Sequence[_Cell | None], secs: Sequence[float]) -> ModelSeries:
    cost = _costs(cells)
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
    cache: SettledCache | None = None,
) -> WindowSeries:
    """Per-bucket series for the window ``[since, until]`` (epoch seconds).

    ``step`` (seconds, a multiple of 60) defaults to :func:`choose_step` of the window; the window
    is widened to start on a bucket boundary (see :func:`bucket_axis`). The rollups are read with
    two grouped queries (see :func:`db.monitor.bucket_cells`), and with ``use_cache`` only from the
    first bucket not yet settled and cached in ``cache`` (default: the process's
    :class:`SettledCache`). Overall series are sums over providers.
    """
    step = step or choose_step(until - since)
    if step <= 0 or step % 60:
        raise ValueError("step must be a positive whole number of minutes (in seconds)")
    buckets, secs = bucket_axis(since, until, step)
    settled = (cache if cache is not None else SETTLED) if use_cache else None
    cells = _window_cells(engine, buckets, step, until, filters or NO_FILTERS, settled)
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
    tot = {c: [0] * n for c in COUNT_COLUMNS}
    cost = [0.0] * n
    for cells in pcells.values():
        for c in COUNT_COLUMNS:
            tot[c] = [x + y for x, y in zip(tot[c], _column(cells, c), strict=False)]
        cost = [x + y for x, y in zip(cost, _costs(cells), strict=False)]
    all_cells = [c for cells in pcells.values() for c in cells if c]
    totals = Totals(
        **{c: sum(tot[c]) for c in COUNT_COLUMNS},
        cost_usd=sum(cost),
        seconds=float(sum(secs)),
        latency=quantiles(_sum_hists((c.sums.lat for c in all_cells), len(LATENCY_BUCKETS))),
        ttft=quantiles(_sum_hists((c.sums.ttft for c in all_cells), len(TTFT_BUCKETS))),
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
        error_rate=tuple(ratio(e, a) for e, a in zip(tot["errors"], tot["attempts"], strict=False)),
        request_error_rate=tuple(ratio(e, r) for e, r in zip(tot["request_errors"], tot["requests"], strict=False)),
        fallback_rate=tuple(ratio(f, r) for f, r in zip(tot["fallbacks"], tot["requests"], strict=False)),
        cost_per_min=tuple(v * 60.0 / s for v, s in zip(cost, secs, strict=False)),
        cum_cost_usd=_cumsum(cost),
        cached_ratio=tuple(ratio(k, p) for k, p in zip(tot["cached_tokens"], tot["prompt_tokens"], strict=False)),
        tokens_per_s=tuple(t / s for t, s in zip(tot["completion_tokens"], secs, strict=False)),
        totals=totals,
    )
