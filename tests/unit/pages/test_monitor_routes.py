"""The Monitor by route and by route deployment, in AppTest: the Route and Deployment filters offer
what had traffic and narrow every number, and the By route / By deployment tables break the
window down, all from the rollups (the raw log emptied under them changes nothing). The two-sided
routing's attempts on the same provider and model are no route's and no deployment's."""

from __future__ import annotations

import time

import pytest
import streamlit as st
from sqlalchemy import delete
from streamlit.testing.v1 import AppTest

from app import monitor as m
from core.records import AttemptRecord
from db.engine import dispose_all, get_engine
from db.models import RequestLog
from db.requests import insert_batch
from tests.support import paths

REPO = paths.REPO


def _attempt(i: int, now: float, provider: str, model: str, route: str | None, ok: bool, **kw) -> AttemptRecord:
    return AttemptRecord(
        request_id=f"{route or 'two-sided'}-{provider}-{i}",
        attempt=1,
        ts=now - 500 + i,
        provider=provider,
        model=model,
        requested_model=route or "auto",
        intent="explicit" if route else "general",
        side="route" if route else "primary",
        status="ok" if ok else "error",
        error_class=None if ok else "server_error",
        latency_ms=100.0,
        source="api",
        route=route,
        deployment=f"{provider}/{model}" if route else None,
        **kw,
    )


def _records(now: float) -> list[AttemptRecord]:
    out = []
    # Route gpt-4.1: 8 requests on direct/gpt-4.1 (2 failed), 4 on holysheep/gpt-4.1.
    out += [_attempt(i, now, "direct", "gpt-4.1", "gpt-4.1", ok=i >= 2) for i in range(8)]
    out += [_attempt(i, now, "holysheep", "gpt-4.1", "gpt-4.1", ok=True) for i in range(4)]
    # Route gemini-2.5-flash: 3 requests on holysheep/gemini-2.5-flash.
    out += [_attempt(i, now, "holysheep", "gemini-2.5-flash", "gemini-2.5-flash", ok=True) for i in range(3)]
    # The two-sided routing on direct/gpt-4.1 too: 5 requests, no route's.
    out += [_attempt(i, now, "direct", "gpt-4.1", None, ok=True) for i in range(5)]
    return out


@pytest.fixture
def app(monkeypatch, sqlite_url):
    insert_batch(get_engine(sqlite_url), _records(time.time()))
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    monkeypatch.setenv("GATEWAY_CONFIG", str(REPO / "gateway.toml"))
    st.cache_data.clear()
    st.cache_resource.clear()
    m.clear_cache()
    at = AppTest.from_file(str(REPO / "ui" / "entry.py"), default_timeout=30).run()
    assert not at.exception
    at.switch_page("../pages/monitor.py")
    yield at
    st.cache_data.clear()
    st.cache_resource.clear()
    m.clear_cache()
    dispose_all()


def _metric(at: AppTest, label: str) -> str:
    return next(mt.value for mt in at.metric if mt.label == label)


LEVEL_TABS = ("provider", "model", "route", "deployment")  # the level tables, in the page's order


def _table(at: AppTest, by: str):
    return at.dataframe[LEVEL_TABS.index(by)].value


def test_route_and_deployment_filters_offer_what_had_traffic(app):
    at = app.run()
    assert not at.exception
    assert at.multiselect(key="monitor_routes").options == ["gemini-2.5-flash", "gpt-4.1"]
    assert at.multiselect(key="monitor_deployments").options == [
        "direct/gpt-4.1",
        "holysheep/gemini-2.5-flash",
        "holysheep/gpt-4.1",
    ]


def test_a_route_or_deployment_filter_narrows_every_number(app):
    at = app.run()
    assert _metric(at, "Requests") == "20"
    at.multiselect(key="monitor_routes").set_value(["gpt-4.1"]).run()
    assert not at.exception
    assert _metric(at, "Requests") == "12"
    at.multiselect(key="monitor_routes").set_value([]).run()
    at.multiselect(key="monitor_deployments").set_value(["direct/gpt-4.1"]).run()
    assert not at.exception
    # the route's 8 attempts on direct/gpt-4.1, not the two-sided routing's 5 on the same pair
    assert _metric(at, "Requests") == "8"
    by_provider = _table(at, "provider")
    assert list(by_provider["provider"]) == ["all", "direct"] and list(by_provider["attempts"]) == [8, 8]
    at.multiselect(key="monitor_routes").set_value(["gemini-2.5-flash"]).run()
    assert _metric(at, "Requests") == "0"  # that deployment serves no request of that route


def test_the_route_and_deployment_tables_break_the_window_down(app):
    at = app.run()
    rate = m.rate_columns("last 1 h")[0]  # the attempt error rate over the window
    routes = _table(at, "route")
    assert list(routes["route"]) == ["gemini-2.5-flash", "gpt-4.1"]
    assert list(routes["requests"]) == [3, 12]
    assert list(routes[rate]) == pytest.approx([0.0, 2 / 12])
    deployments = _table(at, "deployment")
    assert list(deployments.columns[:2]) == ["route", "deployment"]
    assert [
        (r, d, n)
        for r, d, n in zip(deployments["route"], deployments["deployment"], deployments["requests"], strict=True)
    ] == [
        ("gemini-2.5-flash", "holysheep/gemini-2.5-flash", 3),
        ("gpt-4.1", "direct/gpt-4.1", 8),
        ("gpt-4.1", "holysheep/gpt-4.1", 4),
    ]
    assert list(deployments[rate]) == pytest.approx([0.0, 0.25, 0.0])


def test_the_breakdown_reads_the_rollups_not_the_log(app, sqlite_url):
    at = app.run()
    before = _table(at, "deployment").to_dict("list")
    with get_engine(sqlite_url).begin() as conn:
        conn.execute(delete(RequestLog))  # the raw rows gone (as after the log's retention)
    st.cache_data.clear()
    m.clear_cache()
    at.button(key="monitor_refresh").click().run()
    assert not at.exception
    assert _table(at, "deployment").to_dict("list") == before
    assert at.multiselect(key="monitor_deployments").options == [
        "direct/gpt-4.1",
        "holysheep/gemini-2.5-flash",
        "holysheep/gpt-4.1",
    ]
