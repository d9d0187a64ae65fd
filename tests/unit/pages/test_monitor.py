"""The monitor page in AppTest: charts render from a pre-filled SQLite database, and changing the
window or a filter changes what they show."""

from __future__ import annotations

import json
import os
import time

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app import monitor as m
from core.records import AttemptRecord
from db.engine import dispose_all, get_engine
from db.requests import insert_batch
from tests.support import paths

REPO = paths.REPO


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
def app(tmp_path, monkeypatch, sqlite_url):
    url = sqlite_url
    insert_batch(get_engine(url), _records(time.time()))
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("GATEWAY_CONFIG", str(REPO / "gateway.toml"))
    st.cache_data.clear()
    st.cache_resource.clear()
    m.clear_cache()
    at = AppTest.from_file(str(REPO / "ui" / "entry.py"), default_timeout=30).run()
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
    # levels by provider, by model, by route, by deployment, then the recent requests
    assert len(at.dataframe) == 5 and len(at.dataframe[-1].value) == 30
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


def _failure(request_id: str, attempt: int, provider: str, final: bool, **kw) -> AttemptRecord:
    fields = {"model": "gpt-4.1", "requested_model": "auto", "intent": "general", "side": "primary"}
    fields.update(status="error", latency_ms=40.0, final=final, source="api")
    return AttemptRecord(request_id=request_id, attempt=attempt, ts=time.time() - 60 + attempt, provider=provider,
                         **{**fields, **kw})  # fmt: skip


def test_a_failed_requests_drilldown_leads_with_why_then_the_attempts(app):
    msg = "upstream answered 503: <b>overloaded</b> ![x](http://e.x/i.png)"
    insert_batch(
        get_engine(os.environ["DATABASE_URL"]),
        [
            _failure("failed-1", 1, "alpha", False, error_class="timeout", http_status=504, error_message="no answer"),
            _failure("failed-1", 2, "beta", True, error_class="server_error", http_status=503, error_message=msg),
            _failure(
                "refused-1",
                1,
                "direct",
                True,
                model="auto",
                intent="refused",
                side="none",
                error_class="refused_by_policy",
                http_status=400,
                error_message="deepseek-chat-v3.2 is served",
            ),
        ],
    )
    at = app
    at.switch_page("../pages/request.py")
    at.query_params["id"] = "failed-1"
    at.run()
    assert not at.exception
    why = at.error[0].value
    assert why.startswith("**Failed: server\\_error** (HTTP 503): upstream answered 503")
    assert "![x](" not in why and "\\<b\\>" in why  # the upstream's text is shown inert
    assert "2 attempts failed" in why and "the last at beta" in why
    assert [h.value for h in at.subheader][:2] == ["Attempt timeline", "Request"]
    timeline = at.dataframe[0].value  # the attempts come right after why
    assert list(timeline["error class"]) == ["timeout", "server_error"] and list(timeline["error"]) == [
        "no answer",
        msg,
    ]
    facts = at.dataframe[1].value
    facts = dict(zip(facts["field"], facts["value"], strict=True))
    assert facts["last tried"] == "beta / gpt-4.1" and "answered by" not in facts

    at.query_params["id"] = "refused-1"
    at.run()
    assert at.error[0].value.startswith("**Failed: refused\\_by\\_policy** (HTTP 400)")
    assert "Refused by the gateway itself, before any provider was asked" in at.error[0].value
    facts = at.dataframe[1].value
    facts = dict(zip(facts["field"], facts["value"], strict=True))
    assert facts["refused by"] == "the gateway, before any provider was asked"

    at.query_params["id"] = "recent-3"  # a success: no alert, the request first
    at.run()
    assert not at.error and [h.value for h in at.subheader][:2] == ["Request", "Attempt timeline"]


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


# -- the request table as an incident tool (issue 17, points 7 and 8) ------------------------------


def _incident(now: float) -> list[AttemptRecord]:
    """130 requests in the last 20 minutes: every second one failed on alpha (timeouts and 5xx),
    some sent with a gateway key, one in a Korean session."""
    out = []
    for k in range(130):
        failed = k % 2 == 0
        out.append(
            AttemptRecord(
                request_id=f"inc-{k:03d}",
                attempt=1,
                ts=now - 1200 + k * 9,
                provider="alpha" if failed or k % 3 else "beta",
                model="gpt-4.1",
                requested_model="auto",
                intent="general",
                side="primary",
                status="error" if failed else "ok",
                http_status=503 if failed else 200,
                error_class=("timeout" if k % 4 == 0 else "server_error") if failed else None,
                error_message="=upstream unavailable, retry later" if failed else None,
                latency_ms=100.0,
                source="loadgen",
                key_name="team-a" if k % 5 == 0 else None,
                session_id="세션-7" if k == 7 else None,
            )
        )
    return out


@pytest.fixture
def incident(app, tmp_path):
    import os

    from db.engine import get_engine as engine_for

    insert_batch(engine_for(os.environ["DATABASE_URL"]), _incident(time.time()))
    st.cache_data.clear()
    return app


def _tables(at: AppTest) -> list:
    return [d for d in at.dataframe if list(d.value.columns[:2]) == ["status", "time_utc"]]


def _table(at: AppTest):
    (table,) = _tables(at)
    return table


def _table_caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if " matching" in c.value or "No rows match" in c.value)


def test_failed_rows_are_marked_first_and_the_table_pages(incident):
    at = incident.run()
    assert not at.exception
    table = _table(at).value
    assert list(table.columns[:7]) == list(m.TABLE_COLUMNS[:7])  # status, time, class, error ... first
    assert _table_caption(at).startswith("rows 1-50 of 160 matching")  # 30 + 130 in the last hour
    assert any("Following the newest rows" in c.value for c in at.caption)
    at.selectbox(key="monitor_status").set_value("error").run()
    assert not at.exception
    table = _table(at).value
    assert set(table["status"]) == {m.FAILED_MARK} and len(table) == 50
    assert set(table["error_class"]) == {"timeout", "server_error"}
    assert _table_caption(at).startswith("rows 1-50 of 65 matching")
    assert any("Held still at" in c.value for c in at.caption)
    first_ids = list(table["request_id"])
    at.button(key="monitor_older").click().run()
    assert not at.exception
    older = _table(at).value
    assert _table_caption(at).startswith("rows 51-65 of 65 matching") and len(older) == 15
    assert not set(older["request_id"]) & set(first_ids)
    assert at.button(key="monitor_older").disabled and not at.button(key="monitor_newer").disabled
    at.button(key="monitor_newer").click().run()
    assert list(_table(at).value["request_id"]) == first_ids
    at.multiselect(key="monitor_error_classes").set_value(["timeout"]).run()
    assert set(_table(at).value["error_class"]) == {"timeout"}
    assert _table_caption(at).startswith("rows 1-33 of 33 matching")
    assert "33 matching rows" in at.get("download_button")[0].proto.label


def test_key_and_session_filters_and_bad_input(incident):
    at = incident.run()
    at.multiselect(key="monitor_key_names").set_value(["team-a"]).run()
    assert not at.exception
    assert set(_table(at).value["key_name"]) == {"team-a"} and _table_caption(at).startswith("rows 1-27 of 27")
    at.multiselect(key="monitor_key_names").set_value([]).run()
    at.text_input(key="monitor_session_text").set_value("세션-7").run()
    assert not at.exception and list(_table(at).value["request_id"]) == ["inc-007"]
    at.text_input(key="monitor_session_text").set_value("bad\x00id").run()
    assert at.error and "NUL" in at.error[0].value and "nothing was searched" in at.error[0].value
    assert not _tables(at)  # refused: no query, no table
    at.text_input(key="monitor_session_text").set_value("").run()
    assert not at.error and _table_caption(at).startswith("rows 1-50 of 160")


def test_the_table_holds_still_while_new_rows_arrive(incident):
    import os

    from db.engine import get_engine as engine_for

    at = incident.run()
    at.button(key="monitor_older").click().run()
    held = list(_table(at).value["request_id"])
    caption = _table_caption(at)
    assert caption.startswith("rows 51-100 of 160")
    held_at = at.session_state["_monitor_table_state"].cursor.held_at
    new = [
        AttemptRecord(
            request_id=f"new-{k}",
            attempt=1,
            ts=held_at + 0.01 * (k + 1),  # newer than what the table holds, older than a Refresh
            provider="alpha",
            model="gpt-4.1",
            requested_model="auto",
            intent="general",
            side="primary",
            status="error",
            latency_ms=5.0,
            source="loadgen",
        )
        for k in range(20)
    ]
    insert_batch(engine_for(os.environ["DATABASE_URL"]), new)
    at.run()  # what an auto-refresh tick of the charts (or any rerun) does
    assert list(_table(at).value["request_id"]) == held and _table_caption(at) == caption
    at.button(key="monitor_table_refresh").click().run()  # explicit: re-read up to now, same anchor
    assert list(_table(at).value["request_id"]) == held and _table_caption(at).startswith("rows 71-120 of 180")
    at.button(key="monitor_newest").click().run()
    assert _table(at).value["request_id"][0].startswith("new-")
    assert any("Following the newest rows" in c.value for c in at.caption)
