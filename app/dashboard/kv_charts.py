"""Plotly figures for the KV-calculator page, built from numbers the engine computed.

Figures are plain plotly objects (no streamlit). Byte counts stay exact integers in the engine;
only here are they turned into GiB floats for plotting.
"""

from __future__ import annotations

import plotly.graph_objects as go

from kvcache.capacity import CapacityPlan

GIB = float(1 << 30)


def context_points(chosen: int, maximum: int) -> list[int]:
    """Powers of two from 512 up to the model's maximum, plus the maximum and the chosen length."""
    points = {chosen, maximum}
    n = 512
    while n < maximum:
        points.add(n)
        n *= 2
    return sorted(p for p in points if 0 < p <= maximum)


def _hline(y: float, color: str, dash: str, text: str, above: bool) -> tuple[dict, dict]:
    """A full-width horizontal line and its label, as layout dicts (add_hline is slow). The label
    sits in the right margin, beside the plot, so it never covers a bar."""
    shape = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": "y",
        "y0": y,
        "y1": y,
        "line": {"color": color, "dash": dash},
    }
    note = {
        "xref": "paper",
        "x": 1.01,
        "xanchor": "left",
        "yref": "y",
        "y": y,
        # capacity above its line, usable below its own: the two lines are close (0.9 x capacity)
        "yanchor": "bottom" if above else "top",
        "align": "left",
        "text": text,
        "showarrow": False,
        "font": {"color": color},
    }
    return shape, note


def memory_figure(contexts: list[int], plan: CapacityPlan, kv_per_gpu: list[int]) -> go.Figure:
    """Stacked per-GPU memory (weights, reserve, KV for the batch) against context length."""
    x = [f"{c:,}" for c in contexts]
    cap_line = _hline(plan.gpu_memory / GIB, "red", "solid", f"capacity {plan.gpu_memory / GIB:,.0f} GiB", True)
    use_line = _hline(
        plan.usable / GIB,
        "darkorange",
        "dash",
        f"usable ({float(plan.utilization):g}) {plan.usable / GIB:,.1f} GiB",
        False,
    )
    return go.Figure(
        {
            "data": [
                {"type": "bar", "name": "weights", "x": x, "y": [plan.weights_per_gpu / GIB] * len(x)},
                {"type": "bar", "name": "runtime reserve", "x": x, "y": [plan.reserve / GIB] * len(x)},
                {
                    "type": "bar",
                    "name": f"KV cache ({plan.batch_per_replica} seq)",
                    "x": x,
                    "y": [b / GIB for b in kv_per_gpu],
                },
            ],
            "layout": {
                "barmode": "stack",
                "title": {"text": "Memory per GPU against context length"},
                # Category axis: the context lengths are powers of two, which on a linear axis squeezed
                # the short contexts into one thin column of bars.
                "xaxis": {"title": {"text": "context length (tokens)"}, "type": "category"},
                "yaxis": {"title": {"text": "GiB per GPU"}},
                "shapes": [cap_line[0], use_line[0]],
                "annotations": [cap_line[1], use_line[1]],
                "legend": {"orientation": "h", "y": -0.25},
                # the right margin holds the capacity labels, the bottom one the legend
                "margin": {"t": 50, "b": 40, "r": 150},
            },
        }
    )


def concurrency_figure(contexts: list[int], concurrency: list[int], chosen: int, weights_fit: bool = True) -> go.Figure:
    """Maximum concurrent sequences (all replicas) against context length, on log axes (the count
    falls by orders of magnitude from short to long contexts). Lengths where not one sequence
    fits are left off the line and named; when none fits the chart says so instead of drawing a
    flat line at zero."""
    points = [(c, n) for c, n in zip(contexts, concurrency, strict=True) if n > 0]
    annotations = []
    if not points:
        reason = "the weights and reserve leave no KV budget" if not weights_fit else "not one sequence fits"
        annotations.append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 18, "color": "firebrick"},
                "text": f"Does not fit: {reason}",
            }
        )
    elif len(points) < len(contexts):
        first_miss = min(c for c, n in zip(contexts, concurrency, strict=True) if n <= 0)
        annotations.append(
            {
                "xref": "paper",
                "yref": "paper",
                "x": 1,
                "y": 1,
                "xanchor": "right",
                "yanchor": "top",
                "showarrow": False,
                "font": {"color": "firebrick"},
                "text": f"does not fit from {first_miss:,} tokens",
            }
        )
    shapes = []
    if points:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "x0": chosen,
                "x1": chosen,
                "yref": "paper",
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dot"},
            }
        )
        annotations.append(
            {
                "xref": "x",
                "x": chosen,
                "yref": "paper",
                "y": 1,
                "showarrow": False,
                "text": f"{chosen:,} tokens",
                "yanchor": "bottom",
            }
        )
    return go.Figure(
        {
            "data": [
                {
                    "type": "scatter",
                    "x": [c for c, _ in points],
                    "y": [n for _, n in points],
                    "text": [f"{n:,}" for _, n in points],
                    "mode": "lines+markers+text",
                    "textposition": "top right",
                    "name": "max sequences",
                    "hovertemplate": "%{x:,} tokens: %{y:,} sequences<extra></extra>",
                }
            ],
            "layout": {
                "title": {"text": "Maximum concurrent sequences against context length"},
                "xaxis": {"title": {"text": "context length (tokens)"}, "type": "log"},
                "yaxis": {
                    "title": {"text": "sequences (log scale)"},
                    "type": "log",
                    "dtick": "D2",  # 1, 2, 5 per decade: fewer labels than plotly's default
                    "visible": bool(points),
                },
                "shapes": shapes,
                "annotations": annotations,
                "margin": {"t": 50, "b": 40},
            },
        }
    )


def catalog_figure(rows: list[dict], dtypes: list[str], context: int) -> go.Figure:
    """Average bytes per token at `context` for every catalog model and several KV dtypes.

    rows: {"label": str, "dtype": str, "bytes_per_token": float, "tokens": int}
    """
    data = []
    for dtype in dtypes:
        sub = [r for r in rows if r["dtype"] == dtype]
        data.append(
            {
                "type": "bar",
                "name": dtype,
                "x": [r["label"] for r in sub],
                "y": [r["bytes_per_token"] for r in sub],
                "customdata": [r["tokens"] for r in sub],
                "hovertemplate": "%{x}<br>%{y:,.0f} B/token at %{customdata:,} tokens<extra>" + dtype + "</extra>",
            }
        )
    return go.Figure(
        {
            "data": data,
            "layout": {
                "barmode": "group",
                "title": {"text": f"KV bytes per token across models (at {context:,} tokens)"},
                "yaxis": {"type": "log", "title": {"text": "bytes per token (cache / tokens)"}},
                "xaxis": {"tickangle": -40},
                "legend": {"title": {"text": "KV dtype"}},
                "margin": {"t": 50, "b": 160},
            },
        }
    )
