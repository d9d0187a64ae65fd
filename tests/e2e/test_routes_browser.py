"""Routes in Chromium, as an operator runs them mid-incident: four simulated providers, three
routes. Traffic through the routes, then faults on one deployment's provider: the Overview's Routes
table shows each deployment's share and errors, the drill-down of a failed-over request says which
deployment was tried and why, and the Canary page moves a route's canary (a wrong value refused
with nothing written, then a good one audited) and its header follows a change made elsewhere
without a reload. Screenshots: routes-*.png."""

from __future__ import annotations

import pytest
from conftest import REPO, assert_no_exception, open_page, screenshot, start_server, stop_server
from playwright.sync_api import expect

CONFIG_TAIL = """
[providers.azure-eu]
base_url = "sim://azure-eu"
models = ["gpt-4.1"]
default_model = "gpt-4.1"

[providers.vllm-a]
base_url = "sim://vllm-a"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gemini-2.5-flash"

[routes."gpt-4.1"]
deployments = [{ provider = "direct", weight = 3 }, { provider = "azure-eu", weight = 1 }]
fallbacks = ["gemini-2.5-flash"]
allowed_fails = 2
cooldown_s = 120
canary = { provider = "vllm-a" }

[routes."gemini-2.5-flash"]
strategy = "lowest_latency"
deployments = [{ provider = "holysheep" }, { provider = "vllm-a" }]

[routes."claude-sonnet-4-20250514"]
strategy = "ordered"
deployments = [{ provider = "holysheep" }]

[simulator]
latency_scale = 0.02

[dashboard]
refresh_s = 2
"""


def traffic(server, rounds: int) -> None:
    """Requests through the routes from a gateway of this process (another process than the
    dashboard's)."""
    with server.gateway() as g:
        for i in range(rounds):
            for model in ("gpt-4.1", "gpt-4.1", "gemini-2.5-flash", "claude-sonnet-4-20250514"):
                g.client.chat([{"role": "user", "content": f"hello {i}"}], model=model)


@pytest.fixture(scope="module")
def routed_server(tmp_path_factory):
    config = (REPO / "gateway.toml").read_text() + CONFIG_TAIL
    server = start_server(tmp_path_factory.mktemp("routes"), config_text=config)
    try:
        traffic(server, 8)
        from core.faults import FaultSettings
        from db.engine import dispose_all, get_engine
        from db.faults import set_faults

        set_faults(get_engine(server.database_url), "azure-eu", FaultSettings(error_rate=1.0), actor="e2e")
        dispose_all()
        traffic(server, 8)  # azure-eu fails: its deployment cools down, direct answers
        yield server
    finally:
        stop_server(server)


def test_the_overview_shows_each_deployment(routed_server, new_page):
    page = new_page()
    open_page(page, routed_server, "overview")
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text("Routes", exact=True)).to_be_visible(timeout=20_000)
    table = main.get_by_test_id("stDataFrame").filter(has_text="deployment").last
    expect(table).to_be_visible()
    screenshot(page, "routes-1-overview")
    assert_no_exception(page)


def test_a_failed_over_request_says_why_in_its_drill_down(routed_server, new_page):
    from sqlalchemy import create_engine

    engine = create_engine(routed_server.database_url)
    try:
        with engine.connect() as conn:
            rid = conn.exec_driver_sql(
                "select request_id from request_log where deployment = 'azure-eu/gpt-4.1' and status = 'error' "
                "order by ts desc limit 1"
            ).scalar_one()
    finally:
        engine.dispose()
    page = new_page()
    from app.monitor.drilldown import request_link

    open_page(page, routed_server, request_link(rid).lstrip("/"))
    main = page.get_by_test_id("stMain")
    expect(main).to_contain_text("weighted", timeout=20_000)
    expect(main).to_contain_text("azure-eu")
    expect(main).to_contain_text("direct / gpt-4.1")
    screenshot(page, "routes-2-drilldown")
    assert_no_exception(page)


def test_the_canary_page_moves_a_routes_canary(routed_server, new_page):
    page = new_page()
    open_page(page, routed_server, "canary")
    main = page.get_by_test_id("stMain")
    expect(main.get_by_text("Route canaries")).to_be_visible(timeout=20_000)
    share = main.get_by_label("Share (%)")
    share.fill("250")
    share.press("Tab")
    main.get_by_label("Reason (required)").last.fill("try vllm-a for gpt-4.1")
    main.get_by_role("button", name="Apply").last.click()
    expect(main).to_contain_text("must be between 0 and 100", timeout=15_000)
    from db.canary import read_route_ratios
    from db.engine import dispose_all, get_engine

    assert read_route_ratios(get_engine(routed_server.database_url)) == {"gpt-4.1": 0.0}  # nothing written
    screenshot(page, "routes-3-canary-refused")
    share.fill("25")
    share.press("Tab")
    main.get_by_label("Reason (required)").last.fill("try vllm-a for gpt-4.1")
    main.get_by_role("button", name="Apply").last.click()
    expect(main).to_contain_text("set to 25 %", timeout=15_000)
    assert read_route_ratios(get_engine(routed_server.database_url)) == {"gpt-4.1": 0.25}
    dispose_all()
    shown = routed_server.cli("canary", "show", "--route", "gpt-4.1")
    assert "route gpt-4.1 canary ratio 25 %" in shown.stdout
    screenshot(page, "routes-4-canary-set")
    # Another operator moves the global ratio: the header follows within a refresh, no reload, and
    # says Apply is locked on the old version.
    header = main.get_by_test_id("stMetric").filter(has_text="Current canary ratio")
    expect(header).to_contain_text("10 %")
    assert routed_server.cli("canary", "set", "0.3", "--reason", "someone else", "--actor", "bob").returncode == 0
    expect(header).to_contain_text("30 %", timeout=20_000)
    expect(main).to_contain_text("The ratio changed since this page loaded (now 30 % by bob)")
    screenshot(page, "routes-5-header-followed")
    assert_no_exception(page)
