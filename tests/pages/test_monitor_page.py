"""The monitor page in AppTest: charts render from a pre-filled SQLite database, and changing the
window or a filter changes what they show."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app import monitor as m
from core.records import AttemptRecord
from db.engine import dispose_all, get_engine
from db.requests import insert_batch

REPO = Path(__file__).resolve().parents[2]


# Recent requests that used other parts of the OpenAI surface (the rest are chat completions).
API_FIELDS: dict[int, dict] = {
    3: {"api": "responses", "finish_reason": "tool_calls", "tool_calls": 2, "reasoning_tokens": 11},
    4: {"api": "embeddings"},
}


def _records(now: float) -> list[AttemptRecord]:
    out = []
    # 30 requests in the last 10 minutes (alpha and beta), 12 more three hours ago (alpha only).
    for k in range(30):
        out.append(
            AttemptRecord(
                request_id=f"recent-{k}",
                attempt=1,
                ts=now - 600 + k * 20,
                provider=("alpha", "beta")[k % 2],
                model="gpt-4.1",
                requested_model="auto",
                intent="general",
                side="primary",
                status="ok",
                latency_ms=100.0 + k,
                ttft_ms=30.0,
                prompt_tokens=100,
                completion_tokens=20,
                cost_usd=0.01,
                source="loadgen",
                key_name="team-a" if k == 7 else None,
                **API_FIELDS.get(k, {}),
            )
        )
    for k in range(12):
        out.append(
            AttemptRecord(
                request_id=f"old-{k}",
                attempt=1,
                ts=now - 3 * 3600 + k * 30,
                provider="alpha",
                model="gpt-4.1",
                requested_model="auto",
                intent="coding",
                side="primary",
                status="ok",
                latency_ms=300.0,
                cost_usd=0.02,
                source="api",
            )
        )
    return out


@pytest.fixture
def app(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'monitor.db'}"
    insert_batch(get_engine(url), _records(time.time()))
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("GATEWAY_CONFIG", str(REPO / "gateway.toml"))
    st.cache_data.clear()
    st.cache_resource.clear()
    m.clear_cache()
    at = AppTest.from_file(str(REPO / "dashboard" / "entry.py"), default_timeout=30).run()
    assert not at.exception
    at.switch_page("../pages/monitor.py")  # each test's first run() draws the monitor
    yield at
    st.cache_data.clear()
    st.cache_resource.clear()
    m.clear_cache()
    dispose_all()


def _charts(at: AppTest) -> dict[str, dict]:
    specs = [json.loads(el.proto.spec) for el in at.get("plotly_chart")]
    return {s["layout"]["title"]["text"]: s for s in specs}


def _metric(at: AppTest, label: str) -> str:
    return next(mt.value for mt in at.metric if mt.label == label)


def test_renders_charts_metrics_and_table(app):
    at = app.run()
    assert not at.exception
    charts = _charts(at)
    assert len(charts) == 8
    latency = next(s for t, s in charts.items() if t.startswith("Latency per provider"))
    assert [t["name"] for t in latency["data"]][:3] == ["alpha p50", "alpha p95", "alpha p99"]
    assert all(not s["layout"].get("annotations") for s in charts.values())
    assert _metric(at, "Requests") == "30"
    assert len(at.dataframe) == 3 and len(at.dataframe[-1].value) == 30  # levels by provider, by model, recent
    assert "UTC" in " ".join(c.value for c in at.caption)


def test_window_and_filters_change_the_data(app):
    at = app.run()
    at.selectbox(key="monitor_window").set_value("6h").run()
    assert not at.exception
    assert _metric(at, "Requests") == "42"
    at.multiselect(key="monitor_providers").set_value(["beta"]).run()
    assert not at.exception
    assert _metric(at, "Requests") == "15"
    latency = next(s for t, s in _charts(at).items() if t.startswith("Latency per provider"))
    assert {t["legendgroup"] for t in latency["data"]} == {"beta"}
    at.multiselect(key="monitor_providers").set_value([]).run()
    at.multiselect(key="monitor_sources").set_value(["api"]).run()
    assert _metric(at, "Requests") == "12"
    at.selectbox(key="monitor_window").set_value("15m").run()
    assert not at.exception
    assert _metric(at, "Requests") == "0"
    assert all(s["layout"]["annotations"][0]["text"] == "No requests in this window" for s in _charts(at).values())


def test_pause_and_refresh(app):
    at = app.run()
    at.toggle(key="monitor_paused").set_value(True).run()
    assert not at.exception and any("paused" in c.value for c in at.caption)
    at.button(key="monitor_refresh").click().run()
    assert not at.exception
    assert _metric(at, "Requests") == "30"


def test_auto_refresh_defaults_to_the_configured_interval(app, tmp_path, monkeypatch):
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text() + "\n[dashboard]\nrefresh_s = 7\n")
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    st.cache_resource.clear()
    at = app.run()
    assert not at.exception
    interval = at.selectbox(key="monitor_interval_s")
    assert interval.value == 7 and "7 seconds" in interval.options
    assert any("refreshing every 7 s" in c.value for c in at.caption)


def test_three_levels_table_beside_the_kpis(app):
    at = app.run()
    labels = {mt.label for mt in at.metric}
    named = {f"{name}, {span}" for name in m.FIGURE_NAMES.values() for span in ("last 1 h", "last 1 min")}
    assert named <= labels  # the named figures, labelled with their span
    by_provider = at.dataframe[0].value
    assert list(by_provider["provider"]) == ["all", "alpha", "beta"]
    assert {*m.rate_columns("last 1 h"), "req/s, last 1 min"} <= set(by_provider.columns)
    assert "Attempt error rate, last 1 min" in by_provider.columns
    assert list(at.dataframe[1].value["model"]) == ["gpt-4.1"]


def test_recent_rows_link_to_the_drilldown(app):
    at = app.run()
    recent = at.dataframe[-1].value
    assert all(link == f"/request?id={rid}" for link, rid in zip(recent["open"], recent["request_id"], strict=True))


def test_recent_rows_show_api_finish_reason_tool_calls_and_reasoning_tokens(app):
    at = app.run()
    table = at.dataframe[-1]
    recent = table.value.set_index("request_id")
    assert recent.loc["recent-3", ["api", "finish_reason", "tool_calls", "reasoning_tokens"]].tolist() == [
        "responses",
        "tool_calls",
        2,
        11,
    ]
    assert recent.loc["recent-4", "api"] == "embeddings"
    assert recent.loc["recent-5", ["api", "tool_calls", "reasoning_tokens"]].tolist() == ["chat", 0, 0]
    headings = {name: cfg.get("label") for name, cfg in json.loads(table.proto.columns).items()}
    assert {headings[c] for c in ("api", "finish_reason", "tool_calls", "reasoning_tokens")} == {
        "API",
        "finish",
        "tool calls",
        "reasoning tokens",
    }


def test_request_page_shows_the_api_and_for_embeddings_embedding_tokens(app):
    at = app
    at.switch_page("../pages/request.py")
    at.query_params["id"] = "recent-3"
    at.run()
    assert not at.exception
    facts = at.dataframe[0].value
    facts = dict(zip(facts["field"], facts["value"], strict=True))
    assert (facts["API"], facts["finish reason"], facts["tool calls"]) == ("responses", "tool_calls", "2")
    assert facts["reasoning tokens"].startswith("11 ")
    at.query_params["id"] = "recent-4"
    at.run()
    facts = at.dataframe[0].value
    facts = dict(zip(facts["field"], facts["value"], strict=True))
    assert (facts["API"], facts["embedding tokens"]) == ("embeddings", "100")
    assert "completion tokens" not in facts


def test_custom_range_is_validated(app):
    from datetime import UTC, datetime, timedelta

    at = app.run()
    at.selectbox(key="monitor_window").set_value("custom").run()
    assert not at.exception and not at.error
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    at.datetime_input(key="monitor_start").set_value(now - timedelta(hours=4)).run()
    at.datetime_input(key="monitor_end").set_value(now - timedelta(hours=2)).run()
    assert not at.exception and not at.error
    assert _metric(at, "Requests") == "12"  # only the requests three hours ago
    at.datetime_input(key="monitor_end").set_value(now - timedelta(hours=5)).run()
    assert at.error and "end must be after the start" in at.error[0].value
    assert not at.get("plotly_chart")  # nothing drawn for a refused range
    at.datetime_input(key="monitor_start").set_value(now - timedelta(days=40)).run()
    assert "at most 31 days" in at.error[0].value


def test_request_page_shows_a_request_and_searches_sessions(app):
    at = app
    at.switch_page("../pages/request.py")
    at.query_params["id"] = "recent-3"
    at.run()
    assert not at.exception
    facts = at.dataframe[0].value
    assert dict(zip(facts["field"], facts["value"], strict=True))["request id"] == "recent-3"
    timeline = at.dataframe[1].value
    assert list(timeline["provider"]) == ["beta"] and list(timeline["status"]) == ["ok"]
    at.query_params.clear()
    at.query_params["id"] = "no-such-request"
    at.run()
    assert at.warning and "No request" in at.warning[0].value
    at.selectbox[0].set_value("key")
    at.text_input[0].set_value("team-a")
    at.form_submit_button[0].click().run()
    assert not at.exception and not at.error
    matches = at.dataframe[0].value  # the one request sent with gateway key team-a
    assert len(matches) == 1 and "recent-7" in matches.to_csv()
    at.selectbox[0].set_value("request")
    at.text_input[0].set_value("recent-5")
    at.form_submit_button[0].click().run()
    facts = at.dataframe[0].value
    assert dict(zip(facts["field"], facts["value"], strict=True))["request id"] == "recent-5"
    assert at.query_params["id"] in ("recent-5", ["recent-5"])  # the address follows the search
