"""The monitor's logic: series built from the rollup sums of :mod:`db.monitor`
(:mod:`app.monitor.series`, with its settled-bucket cache), the Overview's KPIs, provider health and
the observed canary split (:mod:`app.monitor.stats`), the recent-requests table and its CSV
(:mod:`app.monitor.export`), Plotly figures (:mod:`app.monitor.charts`) and one call that builds a
monitor refresh (:mod:`app.monitor.view`)."""

from app.monitor.export import RECENT_COLUMNS, recent_requests, requests_csv, time_utc
from app.monitor.series import (
    MAX_POINTS,
    QUANTILES,
    ModelSeries,
    Percentiles,
    ProviderSeries,
    SettledCache,
    Totals,
    WindowSeries,
    bucket_axis,
    choose_step,
    clear_cache,
    window_series,
)
from app.monitor.stats import (
    OverviewStats,
    ProviderHealth,
    SplitPoint,
    observed_split,
    overview_stats,
    provider_health,
)
from app.monitor.view import (
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW,
    REFRESH_INTERVALS_S,
    WINDOWS,
    Kpi,
    MonitorState,
    MonitorView,
    filter_choices,
    monitor_view,
    overview_figures,
    refresh_intervals,
    window_label,
    window_seconds,
)
from db.monitor import MonitorFilters

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_WINDOW",
    "MAX_POINTS",
    "QUANTILES",
    "RECENT_COLUMNS",
    "REFRESH_INTERVALS_S",
    "WINDOWS",
    "Kpi",
    "ModelSeries",
    "MonitorFilters",
    "MonitorState",
    "MonitorView",
    "OverviewStats",
    "Percentiles",
    "ProviderHealth",
    "ProviderSeries",
    "SettledCache",
    "SplitPoint",
    "Totals",
    "WindowSeries",
    "bucket_axis",
    "choose_step",
    "clear_cache",
    "filter_choices",
    "monitor_view",
    "observed_split",
    "overview_figures",
    "overview_stats",
    "provider_health",
    "recent_requests",
    "refresh_intervals",
    "requests_csv",
    "time_utc",
    "window_label",
    "window_seconds",
    "window_series",
]
