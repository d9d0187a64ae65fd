"""The Overview's demo traffic: a real background job fills an empty log while the page reruns."""

from __future__ import annotations

import json

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from tests.support import paths

REPO = paths.REPO


# The entry is not beside pages/ (see ui/entry.py), so page paths for at.switch_page(),
# which are relative to the entry, start with "../pages/".
ENTRY = str(REPO / "ui" / "entry.py")


def _clear_caches() -> None:
    st.cache_data.clear()
    st.cache_resource.clear()
    from app.dashboard import demo_traffic
    from db.engine import dispose_all

    for key in list(demo_traffic._jobs):
        job = demo_traffic._jobs[key]
        job.stop()
        job.wait(30)
        demo_traffic.forget_job(key)
    dispose_all()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A temporary database and config with an instant simulator; caches cleared around the test."""
    yield from _env(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'gateway.db'}")


def _env(tmp_path, monkeypatch, url):
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\nseed = 3\n")
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    monkeypatch.setenv("DATABASE_URL", url)
    for var in ("DASHBOARD_PASSWORD", "HOLYSHEEP_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    _clear_caches()
    yield type("Env", (), {"url": url, "config": cfg, "tmp": tmp_path})
    _clear_caches()


def engine():
    from ui import resources

    return resources.engine()


def open_app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(ENTRY, default_timeout=30).run()
    assert not at.exception
    if page:
        at.switch_page(page).run()
        assert not at.exception
    return at


def button(at: AppTest, label: str):
    matches = [b for b in at.button if b.label == label]
    assert matches, f"no button {label!r}; have {[b.label for b in at.button]}"
    return matches[0]


def test_overview_demo_traffic_fills_an_empty_log(env):
    from app.dashboard import demo_traffic

    at = open_app()
    assert any("request log is empty" in i.value for i in at.info)
    monkey = demo_traffic.DEMO_DURATION_S
    demo_traffic.DEMO_DURATION_S = 1.0  # keep the test short; the page reads the module's value
    try:
        button(at, "Generate demo traffic").click().run()
    finally:
        demo_traffic.DEMO_DURATION_S = monkey
    assert not at.exception
    job = demo_traffic.current_job(env.url)
    assert job is not None
    assert job.wait(60) and job.error is None
    at.run()
    assert not at.exception
    assert any("Demo traffic done" in s.value for s in at.success)
    metrics = {m.label: m.value for m in at.main.metric}
    assert int(metrics["Requests, last 15 min"].replace(",", "")) == job.report.ok + job.report.failed > 0
    # The last-hour charts appear once there is traffic, and they hold it.
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [s["layout"]["title"]["text"] for s in specs]
    assert any(t.startswith("Request rate") for t in titles) and any(t.startswith("Latency") for t in titles)
    assert all(s["data"] for s in specs)
    # Under the "Last 15 minutes" heading the charts span 15 minutes, not an hour.
    from datetime import datetime

    for s in specs:
        lo, hi = (datetime.fromisoformat(t) for t in s["layout"]["xaxis"]["range"])
        assert (hi - lo).total_seconds() == 900
        xs = [datetime.fromisoformat(str(x)) for trace in s["data"] for x in trace["x"]]
        assert xs and min(xs) >= lo.replace(second=0) - (hi - lo) / 15  # first bucket starts on a minute
    # A new visitor (another session) is not shown this session's "done" banner.
    other = open_app()
    assert not any("Demo traffic done" in s.value for s in other.success)
    assert any("Demo traffic done" in s.value for s in at.run().success)
    from sqlalchemy import text

    with engine().connect() as conn:
        assert {r[0] for r in conn.execute(text("select distinct source from request_log"))} == {"loadgen"}
