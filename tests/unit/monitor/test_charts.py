"""app.monitor charts and view: traces, titles, units, colours, the empty-data annotation."""

from __future__ import annotations

import json

import plotly.graph_objects as go
import pytest

from app import monitor as m
from app.dashboard.charts import ratio_step_figure, split_figure
from app.dashboard.overview import overview_figures
from app.monitor import charts, window_series
from app.monitor.charts import NOTE_WIDTH_CHARS, empty_figure
from app.monitor.stats import SplitPoint
from app.monitor.view import WINDOWS, MonitorState, filter_choices, monitor_view, window_seconds
from core.records import AttemptRecord
from db.canary import AuditEntry, CanaryState
from db.engine import dispose_all, get_engine
from db.events import Event
from db.requests import insert_batch

T0 = 1_700_006_400 + 12 * 3600


def rec(ts, provider="alpha", model="m1", **kw) -> AttemptRecord:
    base = dict(
        request_id=f"r{ts}-{provider}",
        attempt=1,
        ts=ts,
        provider=provider,
        model=model,
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok",
        latency_ms=120.0,
        ttft_ms=40.0,
        prompt_tokens=100,
        cached_tokens=25,
        completion_tokens=50,
        cost_usd=0.01,
    )
    base.update(kw)
    return AttemptRecord(**base)


@pytest.fixture
def sqlite_engine(sqlite_url):
    m.clear_cache()
    yield get_engine(sqlite_url)
    dispose_all()
    m.clear_cache()


@pytest.fixture
def series(sqlite_engine):
    insert_batch(
        sqlite_engine,
        [rec(T0 + k * 7, provider=("alpha", "beta")[k % 2], model=("m1", "m2", "m3")[k % 3]) for k in range(60)],
    )
    return m.window_series(sqlite_engine, since=T0 - 600, until=T0 + 420)


def _spec(fig: go.Figure) -> dict:
    return json.loads(fig.to_json())


def test_figures_have_titles_units_and_traces(series):
    figs = charts.monitor_figures(series)
    assert list(figs) == [
        "latency",
        "ttft",
        "request_rate",
        "error_rate",
        "cost_by_provider",
        "cost_by_model",
        "cached_ratio",
        "tokens_per_s",
    ]
    for fig in figs.values():
        spec = _spec(fig)
        assert spec["layout"]["title"]["text"]
        assert spec["layout"]["xaxis"]["type"] == "date" and "UTC" in spec["layout"]["xaxis"]["hoverformat"]
        assert spec["layout"]["yaxis"]["title"]["text"]
        assert not spec["layout"].get("annotations")
        assert all(t.get("hovertemplate") for t in spec["data"])
        assert all(len(t["x"]) == len(series.buckets) for t in spec["data"])
    names = [t["name"] for t in _spec(figs["latency"])["data"]]
    assert names == [f"{p} {q}" for p in ("alpha", "beta") for q in ("p50", "p95", "p99")]
    assert "(ms)" in _spec(figs["latency"])["layout"]["yaxis"]["title"]["text"]
    assert "first token" in _spec(figs["ttft"])["layout"]["title"]["text"]
    model_cost = _spec(figs["cost_by_model"])
    assert [t["name"] for t in model_cost["data"]] == [
        "m1",
        "m1 cumulative",
        "m2",
        "m2 cumulative",
        "m3",
        "m3 cumulative",
    ]
    assert model_cost["layout"]["barmode"] == "stack" and model_cost["layout"]["yaxis2"]["overlaying"] == "y"
    assert {t["name"] for t in _spec(figs["error_rate"])["data"]} >= {"alpha", "beta", "fallback rate (all)"}


def test_provider_colour_is_the_same_in_every_chart(series):
    colors = charts.provider_colors(["alpha", "beta"])
    assert colors["alpha"] != colors["beta"]
    for fig in charts.monitor_figures(series).values():
        for t in _spec(fig)["data"]:
            for name in ("alpha", "beta"):
                if t["name"].split(" ")[0] == name:
                    color = t.get("line", {}).get("color") or t.get("marker", {}).get("color")
                    assert color == colors[name]
    assert charts.provider_colors(["beta"])["beta"] == charts.provider_colors(["alpha", "beta"])["beta"]


def test_colours_are_distinct_up_to_the_palette_size():
    names = [f"provider-{i}" for i in range(len(charts.PALETTE))]
    assert len(set(charts.provider_colors(names).values())) == len(names)


def test_empty_window_shows_annotation(sqlite_engine):
    empty = m.window_series(sqlite_engine, since=T0 - 900, until=T0)
    for fig in charts.monitor_figures(empty).values():
        spec = _spec(fig)
        assert spec["data"] == []
        assert spec["layout"]["annotations"][0]["text"] == charts.EMPTY_TEXT
        assert spec["layout"]["title"]["text"]


def test_split_figure_shows_observed_share_against_the_target():
    """The canary page's split chart (app.dashboard.charts: the one split figure)."""
    from app.dashboard.charts import split_figure
    from db.canary import CanaryState

    pts = [m.SplitPoint(T0, 60, 3, 1), m.SplitPoint(T0 + 60, 60, 0, 0)]
    state = CanaryState(ratio=0.25, version=1, updated_at=T0 - 7200, updated_by="a", reason="r")
    fig = split_figure(pts, [], state, T0 + 90, 15)
    target, observed = fig.data
    assert target.name == "target" and set(target.y) == {25.0}
    assert observed.name == "observed" and list(observed.y) == [75.0, None]


def test_monitor_view_bundles_everything(sqlite_engine):
    insert_batch(sqlite_engine, [rec(T0 + k, provider=("alpha", "beta")[k % 2]) for k in range(20)])
    view = monitor_view(sqlite_engine, "1h", None, now=T0 + 60)
    assert view.has_data and view.step_s == 60 and len(view.figures) == 8
    assert {k.label for k in view.kpis} >= {
        "Requests",
        "Attempt error rate, last 1 h",
        "Fallback rate, last 1 h",
        "Final failure rate, last 1 h",
        "Attempt error rate, last 1 min",
        "Fallback rate, last 1 min",
        "Final failure rate, last 1 min",
        "Latency p95",
        "Cost",
    }
    assert next(k for k in view.kpis if k.label == "Requests").value == "20"
    page = m.table_view(sqlite_engine, window="1h", now=T0 + 60)
    assert (
        len(page.rows) == 20
        and "".join(m.csv_chunks(sqlite_engine, since=page.since, until=page.until)).count("\n") == 21
    )
    assert "UTC" in view.caption
    filtered_by = m.MonitorFilters(providers=["beta"])
    filtered = monitor_view(sqlite_engine, "15m", filtered_by, now=T0 + 60)
    assert filtered.series.totals.requests == 10 and {
        r["provider"] for r in m.table_view(sqlite_engine, window="15m", filters=filtered_by, now=T0 + 60).rows
    } == {"beta"}
    assert not monitor_view(sqlite_engine, "15m", None, now=T0 + 86400).has_data
    with pytest.raises(ValueError, match="15m"):
        monitor_view(sqlite_engine, "3h", None)
    choices = filter_choices(sqlite_engine, "1h", m.MonitorFilters(models=["gone"]), now=T0 + 60)
    assert choices["providers"] == ["alpha", "beta"] and choices["models"] == ["gone", "m1"]


def test_windows_and_state():
    assert list(WINDOWS) == ["15m", "1h", "6h", "24h", "7d"]
    assert window_seconds("7d") == 7 * 86400
    s = MonitorState.from_session(
        {
            MonitorState.key("window"): "24h",
            MonitorState.key("providers"): ["a"],
            MonitorState.key("interval_s"): 7,
            MonitorState.key("paused"): True,
        }
    )
    assert s.window == "24h" and s.filters.providers == ("a",) and s.interval_s == 5 and s.run_every is None
    assert MonitorState.from_session({}).run_every == 5
    with pytest.raises(KeyError):
        MonitorState.key("nope")


def test_configured_refresh_interval_is_the_default_and_offered():
    assert m.refresh_intervals(7) == (2, 5, 7, 10, 30) and m.refresh_intervals(5.0) == (2, 5, 10, 30)
    assert MonitorState.from_session({}, 7).run_every == 7
    chosen = {MonitorState.key("interval_s"): 30}
    assert MonitorState.from_session(chosen, 7).interval_s == 30  # the operator's pick wins
    assert MonitorState.from_session({MonitorState.key("interval_s"): 4}, 7).interval_s == 7  # not offered


def test_ttft_chart_explains_when_nothing_was_streamed(sqlite_engine):
    insert_batch(sqlite_engine, [rec(T0 + k, ttft_ms=None) for k in range(5)])
    series = m.window_series(sqlite_engine, since=T0 - 600, until=T0 + 60)
    ttft = _spec(charts.percentile_figure(series, "ttft"))
    assert not ttft["data"] and "No streamed requests" in ttft["layout"]["annotations"][0]["text"]
    latency = _spec(charts.percentile_figure(series, "latency"))
    assert latency["data"] and not latency["layout"].get("annotations")
    # a series with a single bucket of data is drawn with markers, or it would be invisible
    assert all("markers" in t["mode"] for t in latency["data"])


# -- chart notes -----------------------------------------------------------------------------------
# An empty chart's note is wrapped: Plotly never wraps an annotation, and the time-to-first-token
# note ran off both sides of a half-width chart.


def test_a_long_note_is_wrapped_into_short_lines():
    note = "No streamed requests in this window (time to first token is measured on streams)"
    text = empty_figure("TTFT", text=note).layout.annotations[0].text
    lines = text.split("<br>")
    assert len(lines) > 1 and all(len(line) <= NOTE_WIDTH_CHARS for line in lines)
    assert " ".join(lines) == note


def test_a_short_note_stays_one_line():
    assert empty_figure("x").layout.annotations[0].text == "No requests in this window"


# -- chart time axes -------------------------------------------------------------------------------
# Every time axis says its clock (issue 17 point 10): the Monitor's and the Overview's charts and
# the Canary page's two charts title their x axis "time (UTC)", and their hover labels say UTC.


NOW = 1_800_000_000.0


def x_axis(fig) -> dict:
    return json.loads(fig.to_json())["layout"]["xaxis"]


def test_monitor_and_overview_time_axes_say_utc(sqlite_url):
    engine = get_engine(sqlite_url)
    insert_batch(
        engine,
        [
            AttemptRecord(
                request_id=f"r{i}",
                attempt=1,
                ts=NOW - 300 + i * 10,
                provider="alpha",
                model="gpt-4.1",
                requested_model="auto",
                intent="general",
                side="primary",
                status="ok",
                latency_ms=100.0,
            )
            for i in range(20)
        ],
    )
    figures = dict(charts.monitor_figures(window_series(engine, since=NOW - 900, until=NOW)))
    figures |= {f"overview {k}": v for k, v in overview_figures(engine, now=NOW).items()}
    # every chart of both pages is looked at, not whatever happened to be built
    assert {"latency", "ttft", "request_rate", "error_rate", "overview requests", "overview latency"} <= set(figures)
    for name, fig in figures.items():
        axis = x_axis(fig)
        assert axis["title"]["text"] == "time (UTC)", name
        assert axis["hoverformat"].endswith("UTC"), name


def test_canary_time_axes_say_utc():
    current = CanaryState(ratio=0.2, version=2, updated_at=NOW - 60, updated_by="alice", reason="ramp")
    audit = [AuditEntry(ts=NOW - 60, old_ratio=0.1, new_ratio=0.2, actor="alice", reason="ramp", version=2)]
    points = [SplitPoint(ts=int(NOW) - 120, step_s=60, primary=2, fallback=6)]
    for fig in (ratio_step_figure(audit, current, NOW), split_figure(points, audit, current, NOW, 15)):
        axis = x_axis(fig)
        assert axis["title"]["text"] == "time (UTC)" and axis["hoverformat"].endswith("UTC")


def _validated(fig: go.Figure) -> dict:
    """``fig`` rebuilt by Plotly with its validation: raises on any property outside the schema,
    and coerces every value as Plotly would."""
    return json.loads(go.Figure(fig.to_dict()).to_json())


def test_every_figure_is_what_plotly_validation_makes_of_it(series, sqlite_engine):
    # The figures are made without Plotly's validation: each must be exactly what a validated
    # figure of the same traces and layout is (same JSON), events marked or not, empty or not.
    events = [
        Event(T0 - 300, "canary", None, "canary 10 % -> 25 % <b>", "alice"),
        Event(T0 - 200, "guardrail", None, "canary 25 % -> 0 %", "guardrail"),
        Event(T0 - 100, "breaker", "beta", "open -> half_open", "breaker"),
        Event(T0 - 50, "fault", "alpha", "error_rate 0.5", "bob"),
    ]
    empty = m.window_series(sqlite_engine, since=T0 - 9000, until=T0 - 8000)
    figures = {
        **{f"{k} (events)": v for k, v in charts.monitor_figures(series, events).items()},
        **{f"{k} (no events)": v for k, v in charts.monitor_figures(series).items()},
        **{f"{k} (empty)": v for k, v in charts.monitor_figures(empty, events).items()},
    }
    for name, fig in figures.items():
        assert _spec(fig) == _validated(fig), name
    marked = _spec(figures["latency (events)"])
    assert [t["name"] for t in marked["data"][-4:]] == [
        "canary change",
        "guardrail rollback",
        "circuit breaker",
        "fault injection",
    ]
    assert len(marked["layout"]["shapes"]) == 4 and marked["layout"]["yaxis9"]["visible"] is False
    assert "&lt;b&gt;" in marked["data"][-4]["hovertext"][0]
    assert "shapes" not in _spec(figures["latency (empty)"])["layout"]


def test_events_marked_while_building_equal_markers_added_to_a_validated_figure(series):
    # The builders mark events as a figure is made; add_event_markers marks a made figure (a
    # validated one here): both give the same chart.
    events = [Event(T0 - 300, "canary", None, "ratio", "alice"), Event(T0 - 90, "breaker", "beta", "open", "b")]
    for name, fig in charts.monitor_figures(series, events).items():
        plain = go.Figure(charts.monitor_figures(series)[name].to_dict())
        assert _spec(fig) == _spec(charts.add_event_markers(plain, events)), name
