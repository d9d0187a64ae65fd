"""Plotly figure builders for the monitor, from :mod:`db.monitor` results. No Streamlit here.

Every figure has a title, axis titles with units, UTC time on the x axis and hover text; a provider
keeps its colour across every chart and refresh (:func:`provider_colors`); a figure with nothing to
show carries the annotation :data:`EMPTY_TEXT` instead of empty axes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from db.monitor import SplitPoint, WindowSeries

EMPTY_TEXT = "No requests in this window"
TIME_AXIS = "Time (UTC)"
# Okabe-Ito-like palette: distinguishable for colour-blind readers.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
DASH = {"p50": "solid", "p95": "dash", "p99": "dot"}
HEIGHT = 340


def provider_colors(names: Iterable[str], palette: Sequence[str] = PALETTE) -> dict[str, str]:
    """A stable colour per name: its hash picks a palette slot, so the same provider has the same
    colour whatever else is on the chart; collisions move to the next free slot in name order."""
    out: dict[str, str] = {}
    used: set[int] = set()
    for name in sorted(set(names)):
        slot = zlib.crc32(name.encode()) % len(palette)
        for k in range(len(palette)):
            cand = (slot + k) % len(palette)
            if cand not in used or len(used) >= len(palette):
                break
        used.add(cand)
        out[name] = palette[cand]
    return out


def _times(buckets: Sequence[int]) -> list[datetime]:
    return [datetime.fromtimestamp(b, UTC) for b in buckets]


def _layout(fig: go.Figure, title: str, y_title: str, *, y_percent: bool = False) -> go.Figure:
    fig.update_layout(
        title={"text": title}, height=HEIGHT, margin={"l": 60, "r": 20, "t": 60, "b": 40},
        hovermode="x unified", legend={"orientation": "h", "y": -0.2},
        xaxis={"title": {"text": TIME_AXIS}}, yaxis={"title": {"text": y_title}, "rangemode": "tozero"},
    )
    if y_percent:
        fig.update_yaxes(tickformat=".0%")
    return fig


def empty_figure(title: str, y_title: str = "") -> go.Figure:
    """A titled figure whose only content is the :data:`EMPTY_TEXT` annotation."""
    fig = _layout(go.Figure(), title, y_title)
    fig.add_annotation(text=EMPTY_TEXT, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 16})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _step_label(step_s: int) -> str:
    return f"{step_s // 60} min" if step_s < 3600 else f"{step_s // 3600} h"


def percentile_figure(series: WindowSeries, kind: str = "latency") -> go.Figure:
    """p50 / p95 / p99 per provider over time; ``kind`` is ``latency`` or ``ttft``."""
    label = "Latency" if kind == "latency" else "Time to first token"
    title = f"{label} per provider: p50 / p95 / p99 (per {_step_label(series.step_s)})"
    y_title = f"{label} (ms)"
    if series.empty or not any(getattr(p, kind).p50.count(None) < len(series.buckets)
                               for p in series.providers.values()):
        return empty_figure(title, y_title)
    x, colors = _times(series.buckets), provider_colors(series.providers)
    fig = go.Figure()
    for name, p in series.providers.items():
        pct = getattr(p, kind)
        for q in ("p50", "p95", "p99"):
            fig.add_trace(go.Scatter(
                x=x, y=list(getattr(pct, q)), name=f"{name} {q}", mode="lines", connectgaps=False,
                legendgroup=name, line={"color": colors[name], "dash": DASH[q]},
                hovertemplate=f"{name} {q}: %{{y:,.0f}} ms<extra></extra>"))
    return _layout(fig, title, y_title)


def _per_provider_lines(series: WindowSeries, attr: str, title: str, y_title: str, hover: str,
                        *, y_percent: bool = False) -> go.Figure:
    if series.empty:
        return empty_figure(title, y_title)
    x, colors = _times(series.buckets), provider_colors(series.providers)
    fig = go.Figure()
    for name, p in series.providers.items():
        fig.add_trace(go.Scatter(x=x, y=list(getattr(p, attr)), name=name, mode="lines",
                                 line={"color": colors[name]},
                                 hovertemplate=f"{name}: {hover}<extra></extra>"))
    return _layout(fig, title, y_title, y_percent=y_percent)


def request_rate_figure(series: WindowSeries) -> go.Figure:
    """Requests per second per provider."""
    return _per_provider_lines(series, "request_rate", "Request rate per provider", "Requests / s",
                               "%{y:,.2f} req/s")


def error_rate_figure(series: WindowSeries) -> go.Figure:
    """Attempt error rate per provider, plus the overall fallback and request error rates."""
    title, y_title = "Error and fallback rate", "Share of attempts / requests (%)"
    fig = _per_provider_lines(series, "error_rate", title, y_title, "%{y:.1%} of attempts failed",
                              y_percent=True)
    if series.empty:
        return fig
    x = _times(series.buckets)
    for rates, name, hover, color in (
        (series.fallback_rate, "fallback rate (all)", "%{y:.1%} of requests on fallback", "#555555"),
        (series.request_error_rate, "request error rate (all)", "%{y:.1%} of requests failed", "#D55E00"),
    ):
        fig.add_trace(go.Scatter(x=x, y=list(rates), name=name, mode="lines",
                                 line={"color": color, "dash": "dash"},
                                 hovertemplate=f"{hover}<extra></extra>"))
    return fig


def cost_figure(series: WindowSeries, by: str = "provider") -> go.Figure:
    """Cost per minute as stacked bars by ``provider`` or ``model``, with each one's cumulative
    cost since the window's start as lines on a second axis."""
    title = f"Cost by {by}: USD per minute (bars) and cumulative (lines)"
    if series.empty:
        return empty_figure(title, "USD / min")
    groups = series.providers if by == "provider" else series.models
    colors = provider_colors(groups)
    x = _times(series.buckets)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for name, s in groups.items():
        fig.add_trace(go.Bar(x=x, y=list(s.cost_per_min), name=f"{name}", legendgroup=name,
                             marker_color=colors[name],
                             hovertemplate=f"{name}: $%{{y:,.4f}}/min<extra></extra>"), secondary_y=False)
        fig.add_trace(go.Scatter(x=x, y=list(s.cum_cost_usd), name=f"{name} cumulative", legendgroup=name,
                                 mode="lines", line={"color": colors[name], "width": 2},
                                 hovertemplate=f"{name} cumulative: $%{{y:,.4f}}<extra></extra>"),
                      secondary_y=True)
    _layout(fig, title, "USD / min")
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="Cumulative USD", secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


def cached_ratio_figure(series: WindowSeries) -> go.Figure:
    """Cached prompt tokens / prompt tokens per provider."""
    return _per_provider_lines(series, "cached_ratio", "Cached-token ratio per provider",
                               "Cached / prompt tokens (%)", "%{y:.1%} cached", y_percent=True)


def tokens_per_s_figure(series: WindowSeries) -> go.Figure:
    """Output-token throughput per provider."""
    return _per_provider_lines(series, "tokens_per_s", "Output tokens per second per provider",
                               "Completion tokens / s", "%{y:,.1f} tok/s")


def split_figure(points: Sequence[SplitPoint], target_ratio: float | None = None) -> go.Figure:
    """Observed primary share of requests per bucket against the target canary ratio."""
    title, y_title = "Observed vs target canary split", "Primary share of requests (%)"
    if not any(p.total for p in points):
        return empty_figure(title, y_title)
    x = _times([p.ts for p in points])
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=x, y=[p.primary_share for p in points], name="observed", mode="lines+markers",
        customdata=[[p.primary, p.fallback] for p in points], line={"color": PALETTE[0]},
        hovertemplate="observed: %{y:.1%} (%{customdata[0]} primary / %{customdata[1]} fallback)<extra></extra>"))
    if target_ratio is not None:
        fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[target_ratio, target_ratio], name="target",
                                 mode="lines", line={"color": PALETTE[1], "dash": "dash"},
                                 hovertemplate="target: %{y:.1%}<extra></extra>"))
    _layout(fig, title, y_title, y_percent=True)
    fig.update_yaxes(range=[0, 1])
    return fig


def monitor_figures(series: WindowSeries) -> Mapping[str, go.Figure]:
    """Every monitor chart, in page order, keyed by a stable name."""
    return {
        "latency": percentile_figure(series, "latency"),
        "ttft": percentile_figure(series, "ttft"),
        "request_rate": request_rate_figure(series),
        "error_rate": error_rate_figure(series),
        "cost_by_provider": cost_figure(series, "provider"),
        "cost_by_model": cost_figure(series, "model"),
        "cached_ratio": cached_ratio_figure(series),
        "tokens_per_s": tokens_per_s_figure(series),
    }
