"""The monitor's logic: series built from the rollup sums of :mod:`db.monitor`
(:mod:`app.monitor.series`, with its settled-bucket cache), the Overview's KPIs, provider health and
the observed canary split (:mod:`app.monitor.stats`), the recent-requests table and its CSV
(:mod:`app.monitor.export`), Plotly figures with event markers (:mod:`app.monitor.charts`), the
three failure levels per provider and model and substitution costs (:mod:`app.monitor.levels`), the
request drill-down (:mod:`app.monitor.drilldown`), the in-process caches of settled data
(:mod:`app.monitor.cache`) and one call that builds a monitor refresh (:mod:`app.monitor.view`)."""

from app.monitor.cache import PartCache, SettledCache, clear_cache
from app.monitor.drilldown import RequestStory, load_story, request_link, search, search_link
from app.monitor.export import RECENT_COLUMNS, RECENT_LABELS, recent_requests, requests_csv, time_utc
from app.monitor.figures import FIGURE_NAMES, Counts, LiveFigures, figure_label, live_figures, span_label
from app.monitor.levels import LevelRow, Levels, Substitutions, intent_models, level_table, levels, rate_columns
from app.monitor.series import (
    MAX_POINTS,
    QUANTILES,
    ModelSeries,
    Percentiles,
    ProviderSeries,
    Totals,
    WindowSeries,
    bucket_axis,
    choose_step,
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
    CUSTOM,
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW,
    MAX_RANGE_S,
    REFRESH_INTERVALS_S,
    WINDOWS,
    Kpi,
    MonitorState,
    MonitorView,
    RangeError,
    custom_range,
    filter_choices,
    monitor_view,
    overview_figures,
    refresh_intervals,
    window_label,
    window_seconds,
)
from db.monitor import MonitorFilters

__all__ = [
    "CUSTOM",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_WINDOW",
    "FIGURE_NAMES",
    "MAX_POINTS",
    "MAX_RANGE_S",
    "QUANTILES",
    "RECENT_COLUMNS",
    "RECENT_LABELS",
    "REFRESH_INTERVALS_S",
    "WINDOWS",
    "Counts",
    "Kpi",
    "LevelRow",
    "Levels",
    "LiveFigures",
    "ModelSeries",
    "MonitorFilters",
    "MonitorState",
    "MonitorView",
    "OverviewStats",
    "PartCache",
    "Percentiles",
    "ProviderHealth",
    "ProviderSeries",
    "RangeError",
    "RequestStory",
    "SettledCache",
    "SplitPoint",
    "Substitutions",
    "Totals",
    "WindowSeries",
    "bucket_axis",
    "choose_step",
    "clear_cache",
    "custom_range",
    "figure_label",
    "filter_choices",
    "intent_models",
    "level_table",
    "levels",
    "live_figures",
    "load_story",
    "monitor_view",
    "observed_split",
    "overview_figures",
    "overview_stats",
    "provider_health",
    "rate_columns",
    "recent_requests",
    "refresh_intervals",
    "request_link",
    "requests_csv",
    "search",
    "search_link",
    "span_label",
    "time_utc",
    "window_label",
    "window_seconds",
    "window_series",
]
