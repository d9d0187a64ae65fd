"""The Overview page's two glanceable charts, over the same window as its headline numbers.

The tiles above them say "Last 15 minutes", so the charts cover exactly that: the x axis is pinned
to ``[now - 15 min, now]`` (the Monitor page has every other window)."""

from __future__ import annotations

import time

import numpy as np
import plotly.graph_objects as go
from sqlalchemy import Engine

from app.monitor.charts import percentile_figure, request_rate_figure
from app.monitor.series import window_series

OVERVIEW_WINDOW_S = 15 * 60


def overview_figures(engine: Engine, now: float | None = None) -> dict[str, go.Figure]:
    """Requests per second and latency percentiles per provider over the last 15 minutes."""
    now = time.time() if now is None else now
    since = now - OVERVIEW_WINDOW_S
    series = window_series(engine, since=since, until=now)
    span = np.asarray([since, now], dtype="float64").astype("datetime64[s]")
    figures = {"requests": request_rate_figure(series), "latency": percentile_figure(series, "latency")}
    for fig in figures.values():
        if fig.layout.xaxis.visible is not False:  # an empty figure hides its axis
            fig.update_xaxes(range=[str(t) for t in span], autorange=False)
    return figures
