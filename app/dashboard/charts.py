"""Plotly figures and tables for the canary page: the audited ratio as a step chart and the observed
vs target split (the only split chart). Built from plain records so they can be checked without a
browser."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pandas as pd
import plotly.graph_objects as go

from app.display.fmt import utc_time
from app.monitor.charts import TIME_AXIS_TITLE, TIME_ZONE
from app.monitor.stats import SplitPoint
from db.canary import AuditEntry, CanaryState

PRIMARY_COLOR = "#2563eb"
TARGET_COLOR = "#f59e0b"


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def audit_frame(entries: Sequence[AuditEntry]) -> pd.DataFrame:
    """Newest first: time, which canary (global or a route's), old, new, actor, reason (percent
    columns as numbers)."""
    return pd.DataFrame(
        {
            "time (UTC)": [utc_time(e.ts) for e in entries],
            "old %": [round(e.old_ratio * 100, 4) for e in entries],
            "new %": [round(e.new_ratio * 100, 4) for e in entries],
            "actor": [e.actor for e in entries],
            "reason": [e.reason for e in entries],
            "version": [e.version for e in entries],
            "canary": ["global" if e.scope == "global" else e.scope.removeprefix("route:") for e in entries],
        },
        columns=["time (UTC)", "canary", "old %", "new %", "actor", "reason", "version"],
    )


def ratio_history(entries: Sequence[AuditEntry], current: CanaryState, now: float) -> tuple[list[float], list[float]]:
    """Step points (epoch, percent) from the oldest audited value to now."""
    ordered = sorted(entries, key=lambda e: (e.ts, e.version))
    xs: list[float] = []
    ys: list[float] = []
    if ordered:
        first = ordered[0]
        xs.append(min(first.ts - 60, now - 3600))
        ys.append(first.old_ratio * 100)
        for e in ordered:
            xs.append(e.ts)
            ys.append(e.new_ratio * 100)
    else:
        xs.append(min(current.updated_at, now - 3600) if current.updated_at else now - 3600)
        ys.append(current.ratio * 100)
    xs.append(now)
    ys.append(current.ratio * 100)
    return xs, ys


def _layout(fig: go.Figure, title: str, height: int = 300) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0, font=dict(size=15)),
        height=height,
        margin=dict(l=10, r=10, t=40, b=10),
        legend=dict(orientation="h", y=-0.35),
        yaxis=dict(title="% to primary", range=[-5, 105], ticksuffix=" %"),
        xaxis=dict(title=dict(text=TIME_AXIS_TITLE, standoff=4), hoverformat=f"%Y-%m-%d %H:%M:%S {TIME_ZONE}"),
        hovermode="x unified",
    )
    return fig


def ratio_step_figure(entries: Sequence[AuditEntry], current: CanaryState, now: float) -> go.Figure:
    xs, ys = ratio_history(entries, current, now)
    fig = go.Figure(
        go.Scatter(
            x=[_dt(x) for x in xs],
            y=ys,
            mode="lines+markers",
            line_shape="hv",
            name="canary ratio",
            line=dict(color=PRIMARY_COLOR, width=2),
        )
    )
    return _layout(fig, "Canary ratio changes")


def split_figure(
    points: Sequence[SplitPoint], entries: Sequence[AuditEntry], current: CanaryState, now: float, minutes: int
) -> go.Figure:
    """Observed share of requests assigned to the primary per bucket, over the target step line
    (the audited ratio in force over the window)."""
    since = now - minutes * 60
    xs = [_dt(p.ts) for p in points]
    observed = [None if p.primary_share is None else p.primary_share * 100 for p in points]
    tx, ty = ratio_history(entries, current, now)
    # Clip the target line to the window, starting from the value in force at its start.
    start_val = ty[0]
    for x, y in zip(tx, ty, strict=False):
        if x <= since:
            start_val = y
    target = [(since, start_val)] + [(x, y) for x, y in zip(tx, ty, strict=False) if x > since]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[_dt(x) for x, _ in target],
            y=[y for _, y in target],
            mode="lines",
            line_shape="hv",
            name="target",
            line=dict(color=TARGET_COLOR, width=2, dash="dash"),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=observed,
            mode="lines+markers",
            name="observed",
            line=dict(color=PRIMARY_COLOR, width=2),
            connectgaps=False,
        )
    )
    _layout(fig, f"Observed vs target split, last {minutes} min")
    fig.update_xaxes(range=[_dt(since), _dt(now)])
    return fig
