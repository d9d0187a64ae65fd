"""Everything the monitor page shows for one refresh, built by one call: :func:`monitor_view`.

The page picks a window (or a custom range, :func:`custom_range`) and filters, calls
:func:`monitor_view` once per refresh and draws what it gets back: KPI tiles with their change
against the previous period of the same length, the level table (attempt errors, fallbacks, final
failures per provider and model, :mod:`app.monitor.levels`) and figures with event markers. The
request table below them is :mod:`app.monitor.table` (it refreshes on its own terms, not with the
charts). :class:`MonitorState` is the page's typed view of its widget state, read from any mapping
(``st.session_state`` in the page).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import plotly.graph_objects as go
from sqlalchemy import Engine

from app.display.fmt import ms, pct, usd, utc_time
from app.monitor.charts import monitor_figures, percentile_figure, request_rate_figure
from app.monitor.figures import (
    ATTEMPT_ERROR_RATE,
    DEFINITIONS,
    FALLBACK_RATE,
    FINAL_FAILURE_RATE,
    LAST_MINUTE_S,
    figure_label,
    span_label,
)
from app.monitor.levels import RECENT_S, LevelRow, Levels, Substitutions, breakdown, levels, substitutions
from app.monitor.series import WindowSeries, window_series
from app.monitor.table import ALL, RequestPage, TableCursor, parse_row_filters, request_page, table_span
from db.events import Event, events_between
from db.monitor import MonitorFilters, filter_options, substitution_sums
from db.raw_log import RowFilters, recent_counts

# Allowed windows, in the order the page offers them: key -> (seconds, label).
WINDOWS: dict[str, tuple[int, str]] = {
    "15m": (15 * 60, "Last 15 minutes"),
    "1h": (3600, "Last hour"),
    "6h": (6 * 3600, "Last 6 hours"),
    "24h": (24 * 3600, "Last 24 hours"),
    "7d": (7 * 86400, "Last 7 days"),
}
DEFAULT_WINDOW = "1h"
CUSTOM = "custom"  # a start/end range chosen by the operator
MAX_RANGE_S = 31 * 86400
REFRESH_INTERVALS_S = (2, 5, 10, 30)
DEFAULT_INTERVAL_S = 5  # the default of ``[dashboard] refresh_s``; the page passes the configured one


def refresh_intervals(default_s: float = DEFAULT_INTERVAL_S) -> tuple[float, ...]:
    """Auto-refresh intervals the page offers: the usual ones plus the configured default
    (``[dashboard] refresh_s``), in order."""
    return tuple(sorted({*REFRESH_INTERVALS_S, default_s}))


def window_seconds(window: str) -> int:
    """Seconds in ``window`` (one of :data:`WINDOWS`); ``ValueError`` names the allowed ones."""
    try:
        return WINDOWS[window][0]
    except KeyError:
        raise ValueError(f"unknown window {window!r}; choose one of {', '.join(WINDOWS)}") from None


def window_label(window: str) -> str:
    return "Custom range" if window == CUSTOM else WINDOWS[window][1]


def window_span(window: str, since: float, until: float) -> str:
    """A window's span as the figures' labels say it: ``last 1 h`` for a preset, ``custom range``."""
    return "custom range" if window == CUSTOM else span_label(until - since)


class RangeError(ValueError):
    """A custom range that cannot be shown; the message says what to fix."""


def _epoch(value: datetime | float | int) -> float:
    if isinstance(value, datetime):
        # A naive time is UTC: the page says every time is UTC.
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return float(value)


def custom_range(
    start: datetime | float, end: datetime | float, *, now: float | None = None, max_s: int = MAX_RANGE_S
) -> tuple[float, float]:
    """``(since, until)`` epoch seconds of an operator's range, or :class:`RangeError`.

    The end must be after the start, the range at most ``max_s`` long (31 days) and must start
    before ``now``; an end in the future is cut to ``now``."""
    now = time.time() if now is None else float(now)
    since, until = _epoch(start), _epoch(end)
    if until <= since:
        raise RangeError("The end must be after the start. Fix: pick an end time later than the start.")
    if until - since > max_s:
        days = (until - since) / 86400
        raise RangeError(
            f"The range is {days:,.1f} days; at most {max_s // 86400} days can be shown. Fix: shorten the range."
        )
    if since >= now:
        raise RangeError("The range starts in the future. Fix: pick a start before now.")
    return since, min(until, now)


@dataclass(frozen=True)
class Kpi:
    """One headline tile: label, formatted value and a help text saying what it counts."""

    label: str
    value: str
    help: str
    delta: str | None = None  # change against the previous period, signed ("+2.5 pp")
    delta_color: Literal["normal", "inverse", "off"] = "normal"  # "inverse" where a rise is bad


@dataclass(frozen=True)
class MonitorView:
    """One refresh of the monitor. ``figures`` is ordered as the page shows them."""

    window: str
    since: float
    until: float
    step_s: int
    has_data: bool
    kpis: tuple[Kpi, ...]
    figures: Mapping[str, go.Figure]
    series: WindowSeries = field(repr=False)
    levels: Levels | None = None
    previous: Levels | None = None
    substitutions: Substitutions | None = None
    events: tuple[Event, ...] = ()

    @property
    def span(self) -> str:
        """The span the window's figures are labelled with: ``last 1 h``, or ``custom range``."""
        return window_span(self.window, self.since, self.until)

    @property
    def caption(self) -> str:
        return (
            f"{window_label(self.window)}: {utc_time(self.since, seconds=False)} to "
            f"{utc_time(self.until, seconds=False)} UTC, "
            f"{self.step_s // 60}-minute buckets; deltas compare with the previous "
            f"{_duration(self.until - self.since)}"
        )


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:,.1f} hours"
    return f"{seconds / 60:,.0f} minutes"


def _pp(now: float | None, before: float | None) -> str | None:
    if now is None or before is None:
        return None
    return f"{(now - before) * 100:+.1f} pp"


def _rel(now: float | None, before: float | None, fmt) -> str | None:
    if now is None or before is None:
        return None
    return fmt(now - before) if before == 0 else f"{fmt(now - before)} ({(now - before) / before:+.0%})"


def _signed_ms(v: float) -> str:
    return f"{v:+,.0f} ms"


def _signed_usd(v: float) -> str:
    return ("+" if v >= 0 else "-") + usd(abs(v))


def _signed_int(v: float) -> str:
    return f"{v:+,.0f}"


def level_kpis(
    cur: LevelRow, prev: LevelRow | None, subs: Substitutions | None, window_rate: float, span: float | str = 3600
) -> tuple[Kpi, ...]:
    """Headline tiles: the named figures (:mod:`app.monitor.figures`) over the window (``span``:
    its seconds or a label) and over the last minute, labelled with their span, then latency, cost
    and substitutions; the window's with their change against ``prev`` (the previous period)."""
    p = prev
    sub_value = f"{subs.requests:,}" if subs else "0"
    sub_delta = f"{_signed_usd(subs.cost_delta_usd)} vs chosen model" if subs and subs.requests else None
    minute = f"Last {RECENT_S:g} s of the range. "
    return (
        Kpi(
            "Requests",
            f"{cur.requests:,}",
            "Caller requests in the window (final rows, refused requests included); "
            f"{cur.now_requests_per_s:,.2f}/s over the last minute, {window_rate:,.2f}/s on average.",
            _rel(cur.requests, p.requests if p else None, _signed_int),
        ),
        Kpi(
            figure_label(ATTEMPT_ERROR_RATE, span),
            pct(cur.attempt_error_rate),
            DEFINITIONS[ATTEMPT_ERROR_RATE],
            _pp(cur.attempt_error_rate, p.attempt_error_rate if p else None),
            "inverse",
        ),
        Kpi(
            figure_label(FINAL_FAILURE_RATE, span),
            pct(cur.final_failure_rate),
            DEFINITIONS[FINAL_FAILURE_RATE],
            _pp(cur.final_failure_rate, p.final_failure_rate if p else None),
            "inverse",
        ),
        Kpi(
            figure_label(FALLBACK_RATE, span),
            pct(cur.fallback_rate),
            DEFINITIONS[FALLBACK_RATE] + " With a provider filter: of the requests that started there.",
            _pp(cur.fallback_rate, p.fallback_rate if p else None),
            "inverse",
        ),
        Kpi(
            "Cost",
            usd(cur.cost_usd),
            "Total cost in the window, USD.",
            _rel(cur.cost_usd, p.cost_usd if p else None, _signed_usd),
            "inverse",
        ),
        Kpi(
            figure_label(ATTEMPT_ERROR_RATE, LAST_MINUTE_S),
            pct(cur.now_attempt_error_rate),
            minute + DEFINITIONS[ATTEMPT_ERROR_RATE],
        ),
        Kpi(
            figure_label(FINAL_FAILURE_RATE, LAST_MINUTE_S),
            pct(cur.now_final_failure_rate),
            minute + DEFINITIONS[FINAL_FAILURE_RATE],
        ),
        Kpi(
            figure_label(FALLBACK_RATE, LAST_MINUTE_S),
            pct(cur.now_fallback_rate),
            minute + DEFINITIONS[FALLBACK_RATE],
        ),
        Kpi(
            "Latency p95",
            ms(cur.p95_ms),
            f"95th percentile attempt latency in the window (p50 {ms(cur.p50_ms)}, p99 {ms(cur.p99_ms)}).",
            _rel(cur.p95_ms, p.p95_ms if p else None, _signed_ms),
            "inverse",
        ),
        Kpi(
            "Substituted",
            sub_value,
            "Requests answered by another model than the one chosen (the provider does not serve "
            "it); the delta is their actual cost minus the same tokens at the chosen model's price.",
            sub_delta,
            "inverse",
        ),
    )


def kpis(series: WindowSeries) -> tuple[Kpi, ...]:
    """Headline tiles for the window (all providers that passed the filters)."""
    t = series.totals
    return (
        Kpi("Requests", f"{t.requests:,}", "Final attempts in the window (one per caller request)."),
        Kpi("Request rate", f"{t.request_rate:,.2f}/s", "Requests per second over the window."),
        Kpi("Error rate", pct(t.request_error_rate), "Requests whose final attempt failed / requests."),
        Kpi("Fallback rate", pct(t.fallback_rate), "Requests served by the fallback route / requests."),
        Kpi("Latency p95", ms(t.latency[1]), "95th percentile attempt latency, all providers."),
        Kpi("TTFT p50", ms(t.ttft[0]), "Median time to first token of streamed attempts."),
        Kpi("Cost", usd(t.cost_usd), "Total cost in the window, USD."),
        Kpi("Cached tokens", pct(t.cached_ratio), "Cached prompt tokens / prompt tokens."),
        Kpi("Output tokens/s", f"{t.tokens_per_s:,.1f}", "Completion tokens per second over the window."),
    )


def monitor_view(
    engine: Engine,
    window: str,
    filters: MonitorFilters | None = None,
    now: float | None = None,
    *,
    span: tuple[float, float] | None = None,
    routes: Mapping[str, str] | None = None,
    intent_models: Mapping[str, str] | None = None,
    compare: bool = True,
) -> MonitorView:
    """Query and build everything the monitor page shows for ``window`` ending at ``now``, or for
    ``span`` (``(since, until)`` from :func:`custom_range`) when ``window`` is :data:`CUSTOM`.

    ``routes`` maps each canary side to the provider its requests start on (the configuration's
    primary and fallback) for the per-provider fallback rate; ``intent_models`` maps an intent to
    the model it chooses, for the substitution cost delta. Queries: two grouped rollup scans for the
    series (settled buckets cached), two for the level table and two for the previous period
    (coarsest rollups that fit), the last minute and the substitutions from indexed ranges of the
    raw log, and the events.
    """
    now = time.time() if now is None else float(now)
    if window == CUSTOM:
        if span is None:
            raise RangeError("A custom range needs a start and an end.")
        since, until = span
    else:
        since, until = now - window_seconds(window), now
    filters = filters or MonitorFilters()
    series = window_series(engine, since=since, until=until, filters=filters)
    first = series.buckets[0]
    cur = levels(
        breakdown(engine, since=first, until=until, filters=filters),
        recent_counts(engine, since=until - RECENT_S, until=until, filters=filters),
        providers=filters.providers,
        routes=routes,
    )
    prev = None
    if compare:
        length = until - first
        prev = levels(
            breakdown(engine, since=first - length, until=first - 1, filters=filters, by_model=False),
            {},
            providers=filters.providers,
            routes=routes,
        )
    subs = substitutions(substitution_sums(engine, since=since, until=until, filters=filters), intent_models or {})
    events = tuple(events_between(engine, since=first, until=until))
    return MonitorView(
        window=window,
        since=since,
        until=until,
        step_s=series.step_s,
        has_data=not series.empty,
        kpis=level_kpis(
            cur.total,
            prev.total if prev else None,
            subs,
            series.totals.request_rate,
            span=window_span(window, since, until),
        ),
        figures=monitor_figures(series, events),
        series=series,
        levels=cur,
        previous=prev,
        substitutions=subs,
        events=events,
    )


def table_view(
    engine: Engine,
    *,
    window: str,
    span: tuple[float, float] | None = None,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    cursor: TableCursor | None = None,
    now: float | None = None,
) -> RequestPage:
    """The request table's page for ``window`` (or the custom ``span``) at ``cursor``: while the
    cursor holds still the window ends at its held time, not at ``now``."""
    now = time.time() if now is None else float(now)
    cursor = cursor or TableCursor()
    if window == CUSTOM:
        if span is None:
            raise RangeError("A custom range needs a start and an end.")
        since, until = table_span(None, span, cursor, now)
    else:
        since, until = table_span(window_seconds(window), None, cursor, now)
    return request_page(engine, since=since, until=until, filters=filters, rows=rows, cursor=cursor)


def filter_choices(
    engine: Engine, window: str, selected: MonitorFilters | None = None, now: float | None = None
) -> dict[str, list[str]]:
    """Values offered by each filter: those with traffic in ``window``, plus whatever is already
    selected (a selection must stay valid when the window moves past its last request)."""
    now = time.time() if now is None else float(now)
    # A custom range may lie anywhere in the last 31 days: offer what that period had.
    length = MAX_RANGE_S if window == CUSTOM else window_seconds(window)
    options = filter_options(engine, since=now - length)
    chosen = selected or MonitorFilters()
    for key in options:
        options[key] = sorted(set(options[key]) | set(getattr(chosen, key)))
    return options


@dataclass(frozen=True)
class MonitorState:
    """The monitor page's widget state, typed. Widgets store their values under :meth:`key`."""

    window: str = DEFAULT_WINDOW
    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    intents: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    deployments: tuple[str, ...] = ()
    interval_s: float = DEFAULT_INTERVAL_S
    paused: bool = False
    start: datetime | None = None  # custom range (UTC), used when ``window`` is CUSTOM
    end: datetime | None = None
    # The request table's own filters (the rollups do not carry these columns).
    status: str = ALL
    error_classes: tuple[str, ...] = ()
    key_names: tuple[str, ...] = ()
    session_text: str = ""

    PREFIX = "monitor_"

    @classmethod
    def key(cls, name: str) -> str:
        if name not in cls.__dataclass_fields__:
            raise KeyError(name)
        return cls.PREFIX + name

    @classmethod
    def from_session(cls, session: Mapping[Any, Any], default_interval_s: float = DEFAULT_INTERVAL_S) -> MonitorState:
        """Read the widget values from ``session`` (defaults for any not set yet or invalid; the
        refresh interval defaults to ``default_interval_s``, the configured ``[dashboard] refresh_s``)."""

        def get(name: str, default: Any) -> Any:
            value = session.get(cls.key(name), default)
            return default if value is None else value

        window = get("window", DEFAULT_WINDOW)
        interval = get("interval_s", default_interval_s)
        start, end = get("start", None), get("end", None)
        return cls(
            window=window if window in WINDOWS or window == CUSTOM else DEFAULT_WINDOW,
            providers=tuple(get("providers", ())),
            models=tuple(get("models", ())),
            intents=tuple(get("intents", ())),
            sources=tuple(get("sources", ())),
            routes=tuple(get("routes", ())),
            deployments=tuple(get("deployments", ())),
            interval_s=interval if interval in refresh_intervals(default_interval_s) else default_interval_s,
            paused=bool(get("paused", False)),
            start=start if isinstance(start, datetime) else None,
            end=end if isinstance(end, datetime) else None,
            status=str(get("status", ALL)),
            error_classes=tuple(get("error_classes", ())),
            key_names=tuple(get("key_names", ())),
            session_text=get("session_text", ""),
        )

    def span(self, now: float | None = None) -> tuple[float, float] | None:
        """The custom range as epoch seconds (:func:`custom_range`; raises :class:`RangeError`),
        ``None`` for a preset window."""
        if self.window != CUSTOM:
            return None
        if self.start is None or self.end is None:
            raise RangeError("A custom range needs a start and an end.")
        return custom_range(self.start, self.end, now=now)

    @property
    def filters(self) -> MonitorFilters:
        return MonitorFilters(self.providers, self.models, self.intents, self.sources, self.routes, self.deployments)

    def row_filters(self) -> RowFilters:
        """The table's filters; ``ValueError`` with the operator's message for a refused value."""
        return parse_row_filters(self.status, self.error_classes, self.key_names, self.session_text)

    def table_query(self, span: tuple[float, float] | None, rows: RowFilters) -> tuple:
        """What a table position belongs to: a change of window, range or filter starts over."""
        return (self.window, span, self.filters, rows)

    def table_filtered(self, rows: RowFilters) -> bool:
        return self.filters.active or rows.active

    def window_start(self, span: tuple[float, float] | None, now: float | None = None) -> float:
        """The start of the window (or range) the filter choices are read from."""
        if span is not None:
            return span[0]
        now = time.time() if now is None else now
        return now - window_seconds(self.window if self.window in WINDOWS else DEFAULT_WINDOW)

    @property
    def run_every(self) -> float | None:
        """The fragment's refresh interval in seconds, ``None`` while paused or on a custom range
        (a past range does not change)."""
        return None if self.paused or self.window == CUSTOM else self.interval_s


def overview_figures(engine: Engine, now: float | None = None) -> dict[str, go.Figure]:
    """The Overview page's two glanceable charts for the last hour: requests per second and
    latency percentiles per provider (the Monitor page has the rest), with the hour's events marked."""
    now = time.time() if now is None else now
    series = window_series(engine, since=now - window_seconds("1h"), until=now)
    events = events_between(engine, since=series.buckets[0], until=now)
    return {"requests": request_rate_figure(series, events), "latency": percentile_figure(series, "latency", events)}
