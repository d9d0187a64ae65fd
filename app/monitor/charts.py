"""Plotly figure builders for the monitor, from :mod:`app.monitor.series` results. No Streamlit here.

Every figure has a title, axis titles with units, UTC time on the x axis and hover text; a provider
keeps its colour across every chart and refresh (:func:`provider_colors`); a figure with nothing to
show carries the annotation :data:`EMPTY_TEXT` instead of empty axes.

Series go in as NumPy arrays (time as ``datetime64``, gaps as NaN) and traces and layouts as plain
dicts, built here in Plotly's own schema, so a figure is made without Plotly's validation
(:func:`figure`): validating the eight monitor charts (their traces, layouts and event markers)
cost more CPU than every database read of a 24-hour render. The unit tests validate every figure
made here against the schema (a validated copy must serialise to the same JSON).
"""

from __future__ import annotations

import html
import textwrap
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from app.monitor.series import WindowSeries
from db.events import Event

EMPTY_TEXT = "No requests in this window"
NOTE_WIDTH_CHARS = 40  # an empty chart's note, per line (fits a half-width chart on a laptop)
TIME_ZONE = "UTC"  # every time axis is UTC; hover labels and the axis title say so
TIME_AXIS_TITLE = f"time ({TIME_ZONE})"
# Okabe-Ito palette: distinguishable for colour-blind readers.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#8C564B", "#7F7F7F")
OVERALL_COLOR = "#555555"
DASH = {"p50": "solid", "p95": "dash", "p99": "dot"}
HEIGHT = 400


def provider_colors(names: Iterable[str], palette: Sequence[str] = PALETTE) -> dict[str, str]:
    """A stable colour per name: its hash picks a palette slot, so a provider has the same colour
    whatever else is on the chart; a collision moves to the next free slot, in name order."""
    out: dict[str, str] = {}
    used: set[int] = set()
    for name in sorted(set(names)):
        slot = zlib.crc32(name.encode()) % len(palette)
        for k in range(len(palette)):
            cand = (slot + k) % len(palette)
            if cand not in used:
                break
        used.add(cand)
        out[name] = palette[cand]
    return out


def _times(buckets: Sequence[int]) -> np.ndarray:
    return np.asarray(buckets, dtype="int64").astype("datetime64[s]")


def _values(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype="float64")


def _line(
    x: np.ndarray,
    y: Sequence[float | None],
    name: str,
    color: str,
    hover: str,
    *,
    dash: str = "solid",
    group: str | None = None,
    yaxis: str = "y",
) -> dict:
    values = _values(y)
    # Gaps are not connected, so a bucket with data between empty ones would be invisible as a
    # line: sparse series get markers too.
    sparse = np.count_nonzero(~np.isnan(values)) < max(3, len(values) // 4)
    return {
        "type": "scatter",
        "mode": "lines+markers" if sparse else "lines",
        "x": x,
        "y": values,
        "name": name,
        "legendgroup": group or name,
        "line": {"color": color, "dash": dash},
        "marker": {"size": 5, "color": color},
        "yaxis": yaxis,
        "connectgaps": False,
        "hovertemplate": f"{hover}<extra></extra>",
    }


def _layout(title: str, y_title: str, *, y_percent: bool = False) -> dict:
    yaxis = {"title": {"text": y_title}, "rangemode": "tozero"}
    if y_percent:
        yaxis["tickformat"] = ".0%"
    # The legend goes below the plot, under the time axis and its "time (UTC)" title (a chart read
    # on its own, e.g. a screenshot in an incident report, must say which clock it uses): a legend of
    # several rows then grows downwards instead of colliding with the title or the axis title.
    return {
        "title": {"text": title},
        "height": HEIGHT,
        "margin": {"l": 60, "r": 60, "t": 50, "b": 40},
        "hovermode": "x unified",
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": -0.3, "yanchor": "top"},
        "xaxis": {
            "type": "date",
            "automargin": True,
            "title": {"text": TIME_AXIS_TITLE, "standoff": 4},
            "hoverformat": f"%Y-%m-%d %H:%M {TIME_ZONE}",
        },
        "yaxis": yaxis,
    }


def figure(data: Sequence[dict], layout: dict, events: Sequence[Event] = ()) -> go.Figure:
    """A figure of traces and a layout written as dicts in Plotly's schema, with ``events`` marked
    (:func:`add_event_markers`), made without Plotly's validation (the module docstring says why;
    the tests validate every figure built here)."""
    data = list(data)
    if events and layout.get("xaxis", {}).get("visible") is not False:
        shapes, traces = _event_marks(events)
        layout = {**layout, "shapes": [*layout.get("shapes", ()), *shapes], "yaxis9": dict(EVENT_AXIS)}
        data.extend(traces)
    return go.Figure(data=data, layout=layout, _validate=False)


def empty_figure(title: str, y_title: str = "", text: str | None = None) -> go.Figure:
    """A titled figure whose only content is a note (:data:`EMPTY_TEXT` unless ``text``)."""
    return figure([], _empty_layout(title, y_title, text))


def _empty_layout(title: str, y_title: str = "", text: str | None = None) -> dict:
    layout = _layout(title, y_title)
    layout["xaxis"]["visible"] = False
    layout["yaxis"]["visible"] = False
    layout["annotations"] = [
        {
            # Plotly never wraps an annotation: a long note in a half-width chart ran off both sides.
            "text": "<br>".join(textwrap.wrap(text or EMPTY_TEXT, NOTE_WIDTH_CHARS)),
            "x": 0.5,
            "y": 0.5,
            "xref": "paper",
            "yref": "paper",
            "showarrow": False,
            "font": {"size": 16},
        }
    ]
    return layout


def _step_label(step_s: int) -> str:
    return f"{step_s // 60} min" if step_s < 3600 else f"{step_s // 3600} h"


def percentile_figure(series: WindowSeries, kind: str = "latency", events: Sequence[Event] = ()) -> go.Figure:
    """p50 / p95 / p99 per provider over time; ``kind`` is ``latency`` or ``ttft``; ``events``
    marked."""
    if kind not in ("latency", "ttft"):
        raise ValueError("kind must be 'latency' or 'ttft'")
    label = "Latency" if kind == "latency" else "Time to first token"
    title = f"{label} per provider: p50 / p95 / p99 ({_step_label(series.step_s)} buckets)"
    y_title = f"{label} (ms)"
    has_samples = any(v is not None for p in series.providers.values() for v in getattr(p, kind).p50)
    if not has_samples:
        note = None
        if kind == "ttft" and not series.empty:
            note = "No streamed requests in this window (time to first token is measured on streams)"
        return empty_figure(title, y_title, note)
    x, colors = _times(series.buckets), provider_colors(series.providers)
    traces = [
        _line(
            x,
            getattr(getattr(p, kind), q),
            f"{name} {q}",
            colors[name],
            f"{name} {q}: %{{y:,.0f}} ms",
            dash=DASH[q],
            group=name,
        )
        for name, p in series.providers.items()
        for q in ("p50", "p95", "p99")
    ]
    return figure(traces, _layout(title, y_title), events)


def _per_provider(
    series: WindowSeries,
    attr: str,
    title: str,
    y_title: str,
    hover: str,
    *,
    y_percent: bool = False,
    extra: Sequence[dict] = (),
    events: Sequence[Event] = (),
) -> go.Figure:
    if series.empty:
        return empty_figure(title, y_title)
    x, colors = _times(series.buckets), provider_colors(series.providers)
    traces = [
        _line(x, getattr(p, attr), name, colors[name], f"{name}: {hover}") for name, p in series.providers.items()
    ]
    return figure([*traces, *extra], _layout(title, y_title, y_percent=y_percent), events)


def request_rate_figure(series: WindowSeries, events: Sequence[Event] = ()) -> go.Figure:
    """Requests per second per provider."""
    return _per_provider(
        series, "request_rate", "Request rate per provider", "Requests / s", "%{y:,.2f} req/s", events=events
    )


def error_rate_figure(series: WindowSeries, events: Sequence[Event] = ()) -> go.Figure:
    """Failed-attempt rate per provider, plus the overall request error and fallback rates."""
    x = _times(series.buckets)
    extra = [
        _line(
            x,
            series.request_error_rate,
            "request error rate (all)",
            PALETTE[5],
            "requests failed: %{y:.1%}",
            dash="dash",
        ),
        _line(
            x, series.fallback_rate, "fallback rate (all)", OVERALL_COLOR, "served by fallback: %{y:.1%}", dash="dot"
        ),
    ]
    return _per_provider(
        series,
        "error_rate",
        "Error and fallback rate",
        "Rate (%)",
        "%{y:.1%} of attempts failed",
        y_percent=True,
        extra=extra,
        events=events,
    )


def cost_figure(series: WindowSeries, by: str = "provider", events: Sequence[Event] = ()) -> go.Figure:
    """Cost per minute as stacked bars by ``provider`` or ``model``, with each one's cumulative cost
    since the window's start as lines on a second y axis."""
    if by not in ("provider", "model"):
        raise ValueError("by must be 'provider' or 'model'")
    title = f"Cost by {by}: USD/min (bars), cumulative (lines)"
    if series.empty:
        return empty_figure(title, "USD / min")
    groups = series.providers if by == "provider" else series.models
    x, colors = _times(series.buckets), provider_colors(groups)
    traces = []
    for name, s in groups.items():
        traces.append(
            {
                "type": "bar",
                "x": x,
                "y": _values(s.cost_per_min),
                "name": name,
                "legendgroup": name,
                "marker": {"color": colors[name]},
                "hovertemplate": f"{name}: $%{{y:,.4f}}/min<extra></extra>",
            }
        )
        cumulative = _line(
            x,
            s.cum_cost_usd,
            f"{name} cumulative",
            colors[name],
            f"{name} cumulative: $%{{y:,.2f}}",
            group=name,
            yaxis="y2",
        )
        # One legend entry per name (the bar's); its line shares the colour and the legend group,
        # so clicking the entry hides both. Two entries per model wrapped into a legend taller
        # than the plot.
        cumulative["showlegend"] = False
        traces.append(cumulative)
    layout = _layout(title, "USD / min")
    layout["barmode"] = "stack"
    layout["yaxis2"] = {
        "title": {"text": "Cumulative USD"},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
    }
    return figure(traces, layout, events)


def cached_ratio_figure(series: WindowSeries, events: Sequence[Event] = ()) -> go.Figure:
    """Cached prompt tokens / prompt tokens per provider."""
    return _per_provider(
        series,
        "cached_ratio",
        "Cached-token ratio per provider",
        "Cached / prompt tokens (%)",
        "%{y:.1%} cached",
        y_percent=True,
        events=events,
    )


def tokens_per_s_figure(series: WindowSeries, events: Sequence[Event] = ()) -> go.Figure:
    """Output-token throughput per provider."""
    return _per_provider(
        series,
        "tokens_per_s",
        "Output tokens per second per provider",
        "Completion tokens / s",
        "%{y:,.1f} tok/s",
        events=events,
    )


# Marker colour and label per event kind.
EVENT_STYLE = {
    "canary": ("#0072B2", "canary change"),
    "guardrail": ("#D55E00", "guardrail rollback"),
    "fault": ("#CC79A7", "fault injection"),
    "breaker": ("#E69F00", "circuit breaker"),
}
EVENT_TEXT_MAX = 300


def inert(text: object, limit: int = EVENT_TEXT_MAX) -> str:
    """``text`` as Plotly shows it literally: Plotly's labels understand a subset of HTML (links,
    line breaks, styles), so every ``<``, ``>`` and ``&`` is escaped; long text is cut."""
    s = str(text)
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


def event_label(ev: Event) -> str:
    """One marker's hover text (escaped): time, kind, provider, what changed, who."""
    from app.monitor.export import time_utc

    _, kind = EVENT_STYLE.get(ev.kind, ("#7F7F7F", ev.kind))
    where = f" [{ev.provider}]" if ev.provider else ""
    return inert(f"{time_utc(ev.ts)} {kind}{where}: {ev.detail} (by {ev.actor})")


# Kinds marked only by a short tick at the top of the plot, never a line across it: a breaker
# cycling open -> half-open every ~15 s writes hundreds of transitions an hour, and full-height
# lines that dense paint a solid band over the data.
TOP_ONLY_KINDS = frozenset({"breaker"})
TOP_TICK_Y0 = 0.92


EVENT_AXIS = {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True}


def _event_marks(events: Sequence[Event]) -> tuple[list[dict], list[dict]]:
    """The shapes (a line or top tick per event) and traces (a triangle per event, one trace per
    kind) that mark ``events`` on a time axis: see :func:`add_event_markers`."""
    shapes: list[dict] = []
    by_kind: dict[str, list[Event]] = {}
    for ev in events:
        by_kind.setdefault(ev.kind, []).append(ev)
        color, _ = EVENT_STYLE.get(ev.kind, ("#7F7F7F", ev.kind))
        t = np.datetime64(int(ev.ts * 1000), "ms")
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": t,
                "x1": t,
                "y0": TOP_TICK_Y0 if ev.kind in TOP_ONLY_KINDS else 0,
                "y1": 1,
                "line": {"color": color, "width": 1, "dash": "solid" if ev.kind in TOP_ONLY_KINDS else "dot"},
                "layer": "below",
            }
        )
    traces = []
    for kind, evs in by_kind.items():
        color, label = EVENT_STYLE.get(kind, ("#7F7F7F", kind))
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": np.array([int(e.ts * 1000) for e in evs], dtype="int64").astype("datetime64[ms]"),
                "y": np.full(len(evs), 0.97),
                "yaxis": "y9",
                "name": label,
                "legendgroup": f"event:{kind}",
                "marker": {"symbol": "triangle-down", "size": 10, "color": color},
                "hovertext": [event_label(e) for e in evs],
                "hoverinfo": "text",
            }
        )
    return shapes, traces


def add_event_markers(fig: go.Figure, events: Sequence[Event]) -> go.Figure:
    """Mark each event on ``fig``'s time axis: a dotted vertical line (a short tick in the top
    strip only, for :data:`TOP_ONLY_KINDS`), and a triangle at the top whose hover text says what
    happened (on an invisible 0-1 axis, so it never moves the data's scale). Figures without a
    time axis (empty ones) are left alone. The builders here take ``events`` and mark them as the
    figure is made, which costs less than this update of a made figure."""
    if not events or fig.layout.xaxis.visible is False:
        return fig
    shapes, traces = _event_marks(events)
    fig.update_layout(shapes=[*(fig.layout.shapes or ()), *shapes], yaxis9=EVENT_AXIS)
    fig.add_traces(traces)
    return fig


def monitor_figures(series: WindowSeries, events: Sequence[Event] = ()) -> Mapping[str, go.Figure]:
    """Every monitor chart, in page order, keyed by a stable name, with ``events`` marked on each."""
    return {
        "latency": percentile_figure(series, "latency", events),
        "ttft": percentile_figure(series, "ttft", events),
        "request_rate": request_rate_figure(series, events),
        "error_rate": error_rate_figure(series, events),
        "cost_by_provider": cost_figure(series, "provider", events),
        "cost_by_model": cost_figure(series, "model", events),
        "cached_ratio": cached_ratio_figure(series, events),
        "tokens_per_s": tokens_per_s_figure(series, events),
    }
