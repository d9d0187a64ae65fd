"""Issue 17 (one live picture), AppTest: the Overview's named figures and their labels, the
incident banner naming the provider and the start (UTC), and both updating on a rerun of the
live fragments (``run_every`` never ticks in AppTest, so the test reruns)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text as sql

from app.monitor.figures import FIGURE_NAMES
from core.records import AttemptRecord
from db.breakers import ReportedBreaker, beat
from db.events import record_breaker_change
from db.requests import insert_batch
from tests.unit.ui.test_entry import _env, engine, open_app, shown


@pytest.fixture
def env(tmp_path, monkeypatch, sqlite_url):
    yield from _env(tmp_path, monkeypatch, sqlite_url)


def rec(ts: float, provider: str = "holysheep", **kw) -> AttemptRecord:
    base = dict(
        request_id=f"r{provider}{ts}",
        attempt=1,
        ts=ts,
        provider=provider,
        model="gpt-4.1",
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok",
        latency_ms=100.0,
        source="loadgen",
    )
    base.update(kw)
    return AttemptRecord(**base)


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.main.metric}


def banners(at) -> list[str]:
    return [shown(e.value) for e in at.error] + [shown(w.value) for w in at.warning]


def test_the_overview_labels_every_figure_with_its_span(env):
    now = time.time()
    rows = [rec(now - 20 + k * 0.1, request_id=f"a{k}") for k in range(6)]
    rows += [rec(now - 10, status="error", error_class="breaker_open", latency_ms=0.0, request_id="ref", attempt=0)]
    insert_batch(engine(), rows)
    at = open_app()
    shown_metrics = metrics(at)
    for name in FIGURE_NAMES.values():
        assert f"{name}, last 1 min" in shown_metrics and f"{name}, last 15 min" in shown_metrics
    # 7 requests, one refused before any attempt: it counts.
    assert shown_metrics["Final failure rate, last 1 min"] == f"{100 / 7:.1f} %"
    assert shown_metrics["Attempt error rate, last 15 min"] == f"{100 / 7:.1f} %"
    assert shown_metrics["Requests, last 15 min"] == "7"
    table = at.dataframe[0].value
    assert list(table.columns[:4]) == ["provider", "Attempt error rate, last 1 min", "breaker", "state"]
    assert "Attempt error rate, last 15 min" in table.columns
    assert not banners(at)  # 1 of 7 failed: under the failing threshold, no banner
    assert any("refreshing every 5 s" in c.value for c in at.caption)


def test_a_failing_provider_raises_a_banner_that_follows_the_breaker_without_a_reload(env):
    at = open_app()
    assert not at.error and not at.warning
    now = time.time()
    insert_batch(
        engine(),
        # failing now: the newest failure is well within the quiet time ([dashboard] incident_quiet_s)
        [rec(now - 10 + k / 2, status="error", error_class="server_error", request_id=f"f{k}") for k in range(10)]
        + [rec(now - 45 + k, "direct", request_id=f"d{k}") for k in range(10)],
    )
    from ui import resources

    resources.refresh()  # the queries' 3 s ttl, which a real tick waits out
    at.run()  # the fragment's next tick
    texts = banners(at)
    assert len(texts) == 1 and at.error, texts
    text = texts[0]
    assert text.startswith("**holysheep: incident since ") and " UTC**" in text
    assert "Attempt error rate, last 1 min: 100 % of 10 attempts" in text
    assert "Errors seen since the start: server_error (10)" in text
    assert "Neither the breaker nor the guardrail has acted yet" in text
    assert "direct" not in text.split("**")[1]

    # The breaker opens, cycles, stays open: one incident, started at its first open or earlier.
    for k in range(5):
        old, new = ("half_open", "open") if k % 2 == 0 else ("open", "half_open")
        record_breaker_change(engine(), "holysheep", old, new, "10/10 attempts failed in 30 s")
    with engine().begin() as conn:
        ids = [r[0] for r in conn.execute(sql("select id from ops_event order by id"))]
        for n, id_ in enumerate(ids):
            conn.execute(sql("update ops_event set ts = :ts where id = :id"), {"ts": now - 40 + 5 * n, "id": id_})
    # A live gateway process holds it open (its heartbeat, db.breakers).
    beat(
        engine(),
        process="p1",
        breakers={"holysheep": ReportedBreaker("open", now - 20)},
        now=time.time(),
        pid=1,
        host="h",
        source="api",
    )
    resources.refresh()
    at.run()
    text = banners(at)[0]
    assert "breaker open" in text.split("\n")[0]
    first_open = time.strftime("%H:%M:%S", time.gmtime(now - 40))
    assert f"first opened at {first_open} UTC, opened 3 times since" in text
    table = at.dataframe[0].value
    assert table[table["provider"] == "holysheep"].iloc[0]["state"] == "breaker open"


def test_refusals_before_any_attempt_are_shown_as_the_gateways(env):
    now = time.time()
    refused = dict(status="error", error_class="refused_by_policy", latency_ms=0.0, side="fallback")
    rows = [rec(now - 30 + k, "gateway", request_id=f"g{k}", **refused) for k in range(10)]
    rows += [rec(now - 30 + k, "direct", request_id=f"d{k}") for k in range(5)]
    insert_batch(engine(), rows)
    at = open_app()
    assert not at.error  # no provider's incident
    texts = [shown(w.value) for w in at.warning]
    assert len(texts) == 1 and texts[0].startswith("**Gateway: 10 requests refused before any attempt"), texts
    assert "refused_by_policy (10)" in texts[0]
    table = at.dataframe[0].value
    assert table[table["provider"] == "direct"].iloc[0]["state"] != "failing recently"


def test_the_overview_lists_each_routes_deployments(env):
    env.config.write_text(
        env.config.read_text()
        + '\n[routes."gpt-4.1"]\ndeployments = [{ provider = "direct", weight = 3 }, { provider = "holysheep" }]\n'
    )
    now = time.time()
    insert_batch(engine(), [rec(now - 30, "direct", request_id="routed", route="gpt-4.1", deployment="direct/gpt-4.1")])
    at = open_app()
    assert "Routes" in [s.value for s in at.subheader]
    table = next(df.value for df in at.dataframe if "deployment" in df.value.columns)
    assert list(table["deployment"]) == ["direct/gpt-4.1", "holysheep/gpt-4.1"]
    assert list(table["share"]) == ["weight 3 of 4", "weight 1 of 4"] and list(table["attempts"]) == [1, 0]


def test_the_routes_table_shows_a_cooldown_held_in_another_process_while_it_reports(env):
    env.config.write_text(
        env.config.read_text()
        + '\n[routes."gpt-4.1"]\ndeployments = [{ provider = "direct", weight = 3 }, { provider = "holysheep" }]\n'
    )
    now = time.time()
    # A serve process (not this one) has holysheep's deployment cooling down, 25 s left.
    beat(engine(), process="serve-1", breakers={}, cooldowns={"holysheep/gpt-4.1": now + 25}, now=now,
         pid=4242, host="h", source="server")  # fmt: skip
    at = open_app()
    table = next(df.value for df in at.dataframe if "deployment" in df.value.columns)
    health = dict(zip(table["deployment"], table["health"], strict=True))
    assert health["direct/gpt-4.1"] == "ok"
    left = int(health["holysheep/gpt-4.1"].split("(")[1].split(" s left")[0])
    assert 15 <= left <= 25, health
    assert health["holysheep/gpt-4.1"].endswith(" s left) in server pid 4242")
    # That process stops reporting: its report goes stale, and the cooldown no longer counts.
    with engine().begin() as conn:
        conn.execute(sql("UPDATE deployment_cooldown SET beat_at = beat_at - 60"))
    import streamlit as st

    st.cache_data.clear()
    at.run()
    table = next(df.value for df in at.dataframe if "deployment" in df.value.columns)
    assert list(table["health"]) == ["ok", "ok"]


def test_the_banner_names_a_running_then_paused_then_aborted_rollout(env):
    from app.config import load_settings
    from app.rollout import ops
    from core.rollout import check_plan
    from db import rollouts

    s = load_settings(env.config)
    r = ops.start(engine(), s, check_plan(candidate="holysheep", steps="5,100"), actor="alice", reason="new model")
    at = open_app()
    infos = [shown(i.value) for i in at.info]
    assert any(line.startswith("Rollout #1 of holysheep on the global canary is running at 5 %") for line in infos)
    paused = rollouts.apply(engine(), r, state="paused", step_index=0, ratio=None, actor="bob", reason="lunch")
    rollouts.apply(engine(), paused, state="aborted", step_index=0, ratio=0.0, actor="bob", reason="rollout abort")
    import streamlit as st

    st.cache_data.clear()  # what the sidebar's Refresh does; the banner's query is cached briefly
    at.run()
    assert any("is aborted at 5 %: rollout abort" in line for line in banners(at))
