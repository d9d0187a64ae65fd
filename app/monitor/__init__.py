"""The monitor page's logic: one call builds a refresh (:mod:`app.monitor.view`) from the rollup
queries in :mod:`db.monitor`, drawn by the Plotly builders in :mod:`app.monitor.charts`."""

from app.monitor.view import (
    DEFAULT_INTERVAL_S,
    DEFAULT_WINDOW,
    REFRESH_INTERVALS_S,
    WINDOWS,
    Kpi,
    MonitorState,
    MonitorView,
    monitor_view,
    window_label,
    window_seconds,
)
from db.monitor import MonitorFilters

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_WINDOW",
    "REFRESH_INTERVALS_S",
    "WINDOWS",
    "Kpi",
    "MonitorFilters",
    "MonitorState",
    "MonitorView",
    "monitor_view",
    "window_label",
    "window_seconds",
]
