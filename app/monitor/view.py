"""Everything the monitor page shows for one refresh, built by one call: :func:`monitor_view`.

The page picks a window and filters, calls :func:`monitor_view` once per refresh and draws what it
gets back (figures, KPI tiles, the recent-requests table and its CSV). :class:`MonitorState` is the
page's typed view of its widget state, read from any mapping (``st.session_state`` in the page).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from sqlalchemy import Engine

from app.dashboard.fmt import ms, pct, usd, utc_time
from app.monitor.charts import monitor_figures, percentile_figure, request_rate_figure
from app.monitor.export import recent_requests, requests_csv
from app.monitor.series import WindowSeries, window_series
from db.monitor import MonitorFilters, filter_options

# Allowed windows, in the order the page offers them: key -> (seconds, label).
WINDOWS: dict[str, tuple[int, str]] = {
    "15m": (15 * 60, "Last 15 minutes"),
    "1h": (3600, "Last hour"),
    "6h": (6 * 3600, "Last 6 hours"),
    "24h": (24 * 3600, "Last 24 hours"),
    "7d": (7 * 86400, "Last 7 days"),
}
DEFAULT_WINDOW = "1h"
REFRESH_INTERVALS_S = (2, 5, 10, 30)
DEFAULT_INTERVAL_S = 5  # the default of ``[dashboard] refresh_s``; the page passes the configured one
RECENT_ROWS = 200


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
    return WINDOWS[window][1]


@dataclass(frozen=True)
class Kpi:
    """One headline tile: label, formatted value and a help text saying what it counts."""

    label: str
    value: str
    help: str


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
    recent: list[dict]
    recent_csv: str
    series: WindowSeries = field(repr=False)

    @property
    def caption(self) -> str:
        return (
            f"{window_label(self.window)}: {utc_time(self.since, seconds=False)} to "
            f"{utc_time(self.until, seconds=False)} UTC, "
            f"{self.step_s // 60}-minute buckets"
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
    engine: Engine, window: str, filters: MonitorFilters | None = None, now: float | None = None
) -> MonitorView:
    """Query and build everything the monitor page shows for ``window`` ending at ``now``.

    Three queries: two grouped rollup scans for the series, one indexed read of the newest rows.
    """
    now = time.time() if now is None else float(now)
    since = now - window_seconds(window)
    filters = filters or MonitorFilters()
    series = window_series(engine, since=since, until=now, filters=filters)
    recent = recent_requests(engine, limit=RECENT_ROWS, filters=filters, since=since)
    return MonitorView(
        window=window,
        since=since,
        until=now,
        step_s=series.step_s,
        has_data=not series.empty,
        kpis=kpis(series),
        figures=monitor_figures(series),
        recent=recent,
        recent_csv=requests_csv(recent),
        series=series,
    )


def filter_choices(
    engine: Engine, window: str, selected: MonitorFilters | None = None, now: float | None = None
) -> dict[str, list[str]]:
    """Values offered by each filter: those with traffic in ``window``, plus whatever is already
    selected (a selection must stay valid when the window moves past its last request)."""
    now = time.time() if now is None else float(now)
    options = filter_options(engine, since=now - window_seconds(window))
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
    interval_s: float = DEFAULT_INTERVAL_S
    paused: bool = False

    PREFIX = "monitor_"

    @classmethod
    def key(cls, name: str) -> str:
        if name not in cls.__dataclass_fields__:
            raise KeyError(name)
        return cls.PREFIX + name

    @classmethod
    def from_session(cls, session: Mapping[str, Any], default_interval_s: float = DEFAULT_INTERVAL_S) -> MonitorState:
        """Read the widget values from ``session`` (defaults for any not set yet or invalid; the
        refresh interval defaults to ``default_interval_s``, the configured ``[dashboard] refresh_s``)."""

        def get(name: str, default: Any) -> Any:
            value = session.get(cls.key(name), default)
            return default if value is None else value

        window = get("window", DEFAULT_WINDOW)
        interval = get("interval_s", default_interval_s)
        return cls(
            window=window if window in WINDOWS else DEFAULT_WINDOW,
            providers=tuple(get("providers", ())),
            models=tuple(get("models", ())),
            intents=tuple(get("intents", ())),
            sources=tuple(get("sources", ())),
            interval_s=interval if interval in refresh_intervals(default_interval_s) else default_interval_s,
            paused=bool(get("paused", False)),
        )

    @property
    def filters(self) -> MonitorFilters:
        return MonitorFilters(self.providers, self.models, self.intents, self.sources)

    @property
    def run_every(self) -> float | None:
        """The fragment's refresh interval in seconds, ``None`` while paused."""
        return None if self.paused else self.interval_s


def overview_figures(engine: Engine, now: float | None = None) -> dict[str, go.Figure]:
    """The Overview page's two glanceable charts for the last hour: requests per second and
    latency percentiles per provider (the Monitor page has the rest)."""
    now = time.time() if now is None else now
    series = window_series(engine, since=now - window_seconds("1h"), until=now)
    return {"requests": request_rate_figure(series), "latency": percentile_figure(series, "latency")}
