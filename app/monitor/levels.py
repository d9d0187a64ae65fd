"""The monitor's three levels of failure, per provider and per model, side by side.

An incident on one upstream shows at three levels, and an operator needs all three at once:

* **attempt error rate** = failed attempts / attempts: what the upstream did (the guardrail's
  number). A primary failing 70 % of its attempts reads 70 % here.
* **fallback rate** = requests that started on a provider and were answered by the fallback route
  / requests that started there. Per provider this follows the canary side: a request on the
  ``primary`` side starts on the configured primary (``routes``), so the primary's fallback rate
  is the share of its side's requests that failed over. Per model (and without ``routes``) it is
  the share of the model's answers that came through the fallback route.
* **final failure rate** = requests whose final attempt failed / requests: what callers saw.

Beside the window's totals each row carries its rates over the last minute (sixty seconds of the
raw log, not a window average), and the whole-window p50 / p95 / p99 attempt latency and cost.
Substituted requests (answered by another model than the one chosen) are counted with their cost
delta: the actual cost minus the cost of the same tokens at the chosen model's catalog price.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from app import catalog
from app.monitor.cache import PARTS, PartCache, SettledCache
from app.monitor.figures import (
    ATTEMPT_ERROR_RATE,
    FALLBACK_RATE,
    FINAL_FAILURE_RATE,
    LAST_MINUTE_S,
    Counts,
    figure_label,
)
from app.monitor.series import quantiles
from db.models import NO_ROUTE
from db.monitor import (
    COUNT_COLUMNS,
    Breakdown,
    MonitorFilters,
    RecentCounts,
    SubstitutionSums,
    SummedCell,
    deployment_key,
    minute_floor,
    part_cells,
    side_filters,
    span_parts,
)

RECENT_S = float(LAST_MINUTE_S)
ALL = "all"


@dataclass(frozen=True)
class LevelRow:
    """One row of the level table (a provider, a model, or :data:`ALL`)."""

    name: str
    requests: int  # final attempts answered (or failed) here
    attempts: int
    attempt_errors: int
    attempt_error_rate: float | None
    started: int | None  # requests that started here (providers with a known side), else None
    fallbacks: int
    fallback_rate: float | None
    request_errors: int
    final_failure_rate: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    cost_usd: float
    now_requests_per_s: float
    now_attempt_error_rate: float | None
    now_fallback_rate: float | None = None
    now_final_failure_rate: float | None = None
    route: str | None = None  # a deployment's row: the route it serves


def _add(cells: Iterable[SummedCell]) -> SummedCell:
    counts = [0] * len(COUNT_COLUMNS)
    cost, lat, ttft = 0.0, None, None
    for c in cells:
        counts = [a + b for a, b in zip(counts, c.counts, strict=True)]
        cost += c.cost
        if c.lat:
            lat = c.lat if lat is None else tuple(a + b for a, b in zip(lat, c.lat, strict=True))
        if c.ttft:
            ttft = c.ttft if ttft is None else tuple(a + b for a, b in zip(ttft, c.ttft, strict=True))
    return SummedCell(tuple(counts), cost, lat, ttft)


def breakdown(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    by_model: bool = True,
    cache: PartCache | None = PARTS,
) -> Breakdown:
    """Whole-window cells over the minutes from ``since`` to ``until``: by (provider, side) without
    the provider filter (:func:`db.monitor.side_filters`) and, unless ``by_model`` is false, by
    model. Each aligned piece is read from the coarsest rollup table that fits; pieces that ended
    :attr:`SettledCache.SETTLE_S` before ``until`` come from ``cache`` when there."""
    lo, hi = minute_floor(since), minute_floor(until) + 60
    settled_before = until - SettledCache.SETTLE_S
    url = engine.url.render_as_string(hide_password=True)
    # One scan per piece, grouped by (provider, side, model, route) without the provider filter;
    # the by-model and by-deployment cells then keep the selected providers only.
    keys, f = ("provider", "side", "model", "route"), side_filters(filters)
    # Cut at the last whole hour that is settled: the pieces before it change only when the
    # window's start crosses an hour, so they stay cached between refreshes.
    cut = min(max(int(settled_before) // 3600 * 3600, lo), hi)
    acc: dict[tuple, list[SummedCell]] = {}
    for span, a, b in span_parts(lo, cut) + span_parts(cut, hi):
        key = (url, keys, f, span, a, b)
        cells = cache.get(key) if cache is not None and b <= settled_before else None
        if cells is None:
            cells = part_cells(engine, span=span, start=a, end=b, filters=f, keys=keys)
            if cache is not None and b <= settled_before:
                cache.put(key, cells)
        for k, c in cells.items():
            acc.setdefault(k, []).append(c)
    selected = set((filters or MonitorFilters()).providers)
    sides: dict[tuple[str, str], list[SummedCell]] = {}
    models: dict[str, list[SummedCell]] = {}
    deployments: dict[tuple[str, str], list[SummedCell]] = {}
    for (provider, side, model, route), cs in acc.items():
        sides.setdefault((provider, side), []).extend(cs)
        if by_model and (not selected or provider in selected):
            models.setdefault(model, []).extend(cs)
            if route != NO_ROUTE:
                deployments.setdefault((route, deployment_key(provider, model)), []).extend(cs)
    return Breakdown(
        {k: _add(cs) for k, cs in sides.items()},
        {k: _add(cs) for k, cs in models.items()},
        {k: _add(cs) for k, cs in deployments.items()},
    )


def _recent(rows: Iterable[RecentCounts]) -> RecentCounts:
    a = e = r = re = f = 0
    for x in rows:
        a, e, r, re, f = a + x.attempts, e + x.errors, r + x.requests, re + x.request_errors, f + x.fallbacks
    return RecentCounts(a, e, r, re, f)


def _row(
    name: str, cell: SummedCell, started: int | None, fallbacks: int, recent: RecentCounts, recent_s: float
) -> LevelRow:
    # The rates are app.monitor.figures' definitions; a provider's fallback rate counts the
    # requests that started on it (its canary side), when that is known.
    p = quantiles(cell.lat)
    c, now = Counts.of_cell(cell), Counts.of_recent(recent)
    requests = c.requests
    origin = Counts(requests=started if started is not None else requests, fallbacks=fallbacks)
    return LevelRow(
        name=name,
        requests=requests,
        attempts=c.attempts,
        attempt_errors=c.attempt_errors,
        attempt_error_rate=c.attempt_error_rate,
        started=started,
        fallbacks=fallbacks,
        fallback_rate=origin.fallback_rate,
        request_errors=c.request_errors,
        final_failure_rate=c.final_failure_rate,
        p50_ms=p[0],
        p95_ms=p[1],
        p99_ms=p[2],
        cost_usd=cell.cost,
        now_requests_per_s=recent.requests / recent_s,
        now_attempt_error_rate=now.attempt_error_rate,
        now_final_failure_rate=now.final_failure_rate,
    )


@dataclass(frozen=True)
class Levels:
    """The level table: :data:`ALL` (the providers that passed the filters) first in ``total``,
    then one row per provider and per model, and per route and per route deployment (the
    ``[routes]`` traffic only; a deployment's row names its route)."""

    total: LevelRow
    providers: tuple[LevelRow, ...]
    models: tuple[LevelRow, ...]
    routes: tuple[LevelRow, ...] = ()
    deployments: tuple[LevelRow, ...] = ()


def levels(
    breakdown: Breakdown,
    recent: Mapping[str, RecentCounts],
    *,
    providers: Iterable[str] = (),
    routes: Mapping[str, str] | None = None,
    recent_s: float = RECENT_S,
) -> Levels:
    """Build the table. ``providers`` is the provider filter (empty = all); ``routes`` maps a canary
    side (``primary`` / ``fallback``) to the provider its requests start on."""
    selected = set(providers)
    by_side = breakdown.by_provider_side
    names = sorted({p for p, _ in by_side} | set(recent))
    shown = [n for n in names if not selected or n in selected]
    side_requests: dict[str, int] = {}
    side_fallbacks: dict[str, int] = {}
    for (_, side), cell in by_side.items():
        side_requests[side] = side_requests.get(side, 0) + cell.count("requests")
        side_fallbacks[side] = side_fallbacks.get(side, 0) + cell.count("fallbacks")
    origin_sides: dict[str, list[str]] = {}
    for side, provider in (routes or {}).items():
        origin_sides.setdefault(provider, []).append(side)
    empty = RecentCounts(0, 0, 0, 0, 0)

    rows = []
    for name in shown:
        cell = _add(c for (p, _), c in by_side.items() if p == name)
        sides = origin_sides.get(name)
        if sides:
            started = sum(side_requests.get(s, 0) for s in sides)
            fallbacks = sum(side_fallbacks.get(s, 0) for s in sides)
        else:
            started, fallbacks = None, cell.count("fallbacks")
        rows.append(_row(name, cell, started, fallbacks, recent.get(name, empty), recent_s))

    all_cell = _add(c for (p, _), c in by_side.items() if p in shown)
    if selected and routes:
        own = [s for s, p in routes.items() if p in selected]
        t_started = sum(side_requests.get(s, 0) for s in own)
        t_fallbacks = sum(side_fallbacks.get(s, 0) for s in own)
    else:
        t_started, t_fallbacks = all_cell.count("requests"), all_cell.count("fallbacks")
    recent_all = _recent(recent.get(n, empty) for n in shown)
    total = _row(ALL, all_cell, t_started, t_fallbacks, recent_all, recent_s)
    total = _with_now_fallback(total, recent_all)

    model_rows = tuple(
        _row(m, c, None, c.count("fallbacks"), empty, recent_s) for m, c in sorted(breakdown.by_model.items())
    )
    by_route: dict[str, list[SummedCell]] = {}
    for (route, _), c in breakdown.by_deployment.items():
        by_route.setdefault(route, []).append(c)
    route_rows = tuple(
        _row(r, cell, None, cell.count("fallbacks"), empty, recent_s)
        for r, cs in sorted(by_route.items())
        for cell in (_add(cs),)
    )
    deployment_rows = tuple(
        replace(_row(d, c, None, c.count("fallbacks"), empty, recent_s), route=r)
        for (r, d), c in sorted(breakdown.by_deployment.items())
    )
    return Levels(total, tuple(rows), model_rows, route_rows, deployment_rows)


def _with_now_fallback(row: LevelRow, recent: RecentCounts) -> LevelRow:
    return replace(row, now_fallback_rate=Counts.of_recent(recent).fallback_rate)


def rate_columns(span: float | str) -> tuple[str, ...]:
    """The level table's rate columns, named as every page names the figures: the window's
    (``span``: seconds or a label) then the last minute's."""
    window = tuple(figure_label(f, span) for f in (ATTEMPT_ERROR_RATE, FALLBACK_RATE, FINAL_FAILURE_RATE))
    minute = tuple(figure_label(f, LAST_MINUTE_S) for f in (ATTEMPT_ERROR_RATE, FINAL_FAILURE_RATE))
    return window + minute


def level_table(rows: Iterable[LevelRow], *, first: str = "provider", span: float | str = 3600) -> list[dict]:
    """Rows as the page's table shows them (rates as fractions, the page formats them); the rate
    columns are :func:`rate_columns` of ``span``, the window the table covers. A deployment's row
    names its route first."""
    a, f, ff, a_min, ff_min = rate_columns(span)
    return [
        {
            **({"route": r.route} if r.route is not None else {}),
            first: r.name,
            "requests": r.requests,
            "attempts": r.attempts,
            a: r.attempt_error_rate,
            f: r.fallback_rate,
            ff: r.final_failure_rate,
            "p50 ms": r.p50_ms,
            "p95 ms": r.p95_ms,
            "p99 ms": r.p99_ms,
            "cost USD": r.cost_usd,
            "req/s, last 1 min": r.now_requests_per_s,
            a_min: r.now_attempt_error_rate,
            ff_min: r.now_final_failure_rate,
        }
        for r in rows
    ]


# -- substitution ---------------------------------------------------------------------------------


def intent_models(intents) -> dict[str, str]:
    """The model each intent chooses, from the configured :class:`app.config.IntentConfig`: the first
    rule naming an intent wins (as in :func:`app.routing.intent.classify`)."""
    out = {"general": intents.default_model, "long_context": intents.long_context_model}
    for rule in intents.rules:
        out.setdefault(rule.intent, rule.model)
    return out


def chosen_model(requested_model: str, intent: str, by_intent: Mapping[str, str]) -> str | None:
    """The model the router chose before substituting: the caller's model, or for ``auto`` the
    intent's model (``None`` when the intent is unknown to the configuration)."""
    if requested_model and requested_model != "auto":
        return requested_model
    return by_intent.get(intent)


@dataclass(frozen=True)
class Substitutions:
    """Substituted final requests in the window and what they cost beyond the chosen model.

    ``cost_delta_usd`` = actual cost - cost of the same tokens at the chosen model's price, summed
    over the groups whose chosen model is known to the catalog (``unpriced`` counts the others).
    ``by_pair`` lists ``(chosen, served, requests, delta)`` per pair, largest delta first."""

    requests: int
    cost_usd: float
    cost_delta_usd: float
    unpriced: int
    by_pair: tuple[tuple[str, str, int, float], ...]


def substitutions(sums: Iterable[SubstitutionSums], by_intent: Mapping[str, str]) -> Substitutions:
    requests, cost, delta, unpriced = 0, 0.0, 0.0, 0
    pairs: dict[tuple[str, str], list] = {}
    for s in sums:
        requests += s.requests
        cost += s.cost_usd
        chosen = chosen_model(s.requested_model, s.intent, by_intent)
        try:
            if chosen is None:
                raise catalog.UnknownModelError(s.requested_model)
            d = s.cost_usd - catalog.cost_usd(chosen, s.prompt_tokens, s.cached_tokens, s.completion_tokens)
        except catalog.UnknownModelError:
            unpriced += s.requests
            continue
        delta += d
        acc = pairs.setdefault((chosen, s.model), [0, 0.0])
        acc[0] += s.requests
        acc[1] += d
    by_pair = tuple(sorted(((c, m, n, d) for (c, m), (n, d) in pairs.items()), key=lambda p: -p[3]))
    return Substitutions(requests, cost, delta, unpriced, by_pair)
