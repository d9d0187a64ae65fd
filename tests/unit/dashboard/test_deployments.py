"""The Overview's routes table: every deployment of every route as configured, beside what the
rollups say it served (a deployment is a route's provider and the model sent to it), on both
databases."""

from __future__ import annotations

import time

import pytest

from app.config import load_settings
from app.dashboard.deployments import deployment_rows
from db.monitor import deployment_sums
from db.requests import insert_batch
from tests.support import paths
from tests.support.records import attempt

ROUTES = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct", weight = 3 }, { provider = "holysheep", weight = 1, rpm = 600 }]
canary = { provider = "holysheep", model = "deepseek-chat-v3.2" }

[routes."gemini-2.5-flash"]
strategy = "ordered"
deployments = [{ provider = "holysheep" }, { provider = "direct" }]
"""


def settings(tmp_path):
    p = tmp_path / "gateway.toml"
    p.write_text((paths.REPO / "gateway.toml").read_text() + ROUTES)
    return load_settings(p, env={"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})


def test_each_deployment_is_listed_with_its_share_and_traffic(tmp_path, engine):
    now = time.time()
    records = [
        attempt(request_id=f"a{i}", ts=now - 60, provider="direct", model="gpt-4.1", latency_ms=200.0,
                status="error" if i < 2 else "ok", route="gpt-4.1", deployment="direct/gpt-4.1")
        for i in range(8)
    ] + [
        attempt(request_id="r", ts=now - 30, provider="holysheep", model="gpt-4.1", latency_ms=80.0,
                route="gpt-4.1", deployment="holysheep/gpt-4.1"),
        # the same provider and model, but the two-sided routing's: no route's deployment
        attempt(request_id="b", ts=now - 30, provider="holysheep", model="gpt-4.1", latency_ms=80.0),
        attempt(request_id="c", ts=now - 30, provider="holysheep", model="gpt-4.1", latency_ms=80.0),
        # direct's gemini on the gemini route, not on gpt-4.1's
        attempt(request_id="g", ts=now - 30, provider="direct", model="gemini-2.5-flash", latency_ms=80.0,
                route="gemini-2.5-flash", deployment="direct/gemini-2.5-flash"),
    ]  # fmt: skip
    insert_batch(engine, records)
    s = settings(tmp_path)
    sums = deployment_sums(engine, providers=list(s.providers), since=now - 900, until=now)
    assert sums[("gpt-4.1", "direct", "gpt-4.1")].attempts == 8 and sums[("gpt-4.1", "direct", "gpt-4.1")].errors == 2
    assert set(sums) == {
        ("gpt-4.1", "direct", "gpt-4.1"),
        ("gpt-4.1", "holysheep", "gpt-4.1"),
        ("gemini-2.5-flash", "direct", "gemini-2.5-flash"),
    }
    rows = deployment_rows(s, sums, {"gpt-4.1": 0.1})
    assert [(r["route"], r["deployment"], r["share"]) for r in rows] == [
        ("gpt-4.1", "direct/gpt-4.1", "weight 3 of 4"),
        ("gpt-4.1", "holysheep/gpt-4.1", "weight 1 of 4"),
        ("gpt-4.1", "holysheep/deepseek-chat-v3.2", "canary, 10%"),
        ("gemini-2.5-flash", "holysheep/gemini-2.5-flash", "priority 1"),
        ("gemini-2.5-flash", "direct/gemini-2.5-flash", "priority 2"),
    ]
    first = rows[0]
    assert first["attempts"] == 8 and first["error rate"] == pytest.approx(0.25) and 150 <= first["p50 ms"] <= 260
    assert rows[1]["limits"] == "rpm 600" and rows[1]["attempts"] == 1
    assert rows[2]["attempts"] == 0 and rows[2]["error rate"] is None and rows[2]["p50 ms"] is None
    assert (rows[3]["attempts"], rows[4]["attempts"]) == (0, 1)


def test_no_routes_no_rows(tmp_path, engine):
    p = tmp_path / "gateway.toml"
    p.write_text((paths.REPO / "gateway.toml").read_text())
    s = load_settings(p, env={"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})
    assert deployment_rows(s, {}, {}) == []


def test_health_names_the_process_with_the_most_cooldown_left_and_counts_the_others():
    from app.dashboard.deployments import HEALTHY, health_text
    from db.breakers import LiveCooldown

    now = 1_800_000_000.0
    one = [LiveCooldown(now + 24.6, 41, "h", "server")]
    assert health_text(one, now) == "cooling down (25 s left) in server pid 41"
    three = [LiveCooldown(now + 3, 7, "h", "loadgen"), *one, LiveCooldown(now + 9, 8, "h", "playground")]
    assert health_text(three, now) == "cooling down (25 s left) in server pid 41 and 2 other processes"
    assert health_text(three[:2], now).endswith("and 1 other process")
    assert health_text([], now) == HEALTHY


def test_each_row_carries_its_deployments_health(tmp_path):
    from db.breakers import LiveCooldown

    now = 1_800_000_000.0
    s = settings(tmp_path)
    cooling = {"holysheep/gpt-4.1": [LiveCooldown(now + 10, 41, "h", "server")]}
    rows = deployment_rows(s, {}, {}, cooling, now)
    assert [(r["deployment"], r["health"]) for r in rows if r["route"] == "gpt-4.1"] == [
        ("direct/gpt-4.1", "ok"),
        ("holysheep/gpt-4.1", "cooling down (10 s left) in server pid 41"),
        ("holysheep/deepseek-chat-v3.2", "ok"),
    ]
