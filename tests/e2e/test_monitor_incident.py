"""Issue 8 in Chromium: mid-incident (conftest's ``incident_server``: 70 % injected errors on the
primary at a 50 % canary, loadgen traffic, a burst of logged failures) the Monitor's headline shows
the attempt error rate, the fallback rate and the final failure rate, its charts carry the fault and
canary markers, a request's drill-down shows the failed attempt and the fallback that answered, and
the time-to-first-token chart's note fits inside it. Screenshots: monitor-incident.png,
request-drilldown.png, monitor-ttft-note.png."""

from __future__ import annotations

import pytest
from conftest import assert_no_exception, open_page, rerun, screenshot, wait_ready
from playwright.sync_api import expect


def _metrics(page) -> dict[str, str]:
    metrics = page.get_by_test_id("stMain").get_by_test_id("stMetric")
    labels = metrics.get_by_test_id("stMetricLabel").all_inner_texts()
    values = metrics.get_by_test_id("stMetricValue").all_inner_texts()
    return dict(zip((label.strip() for label in labels), values, strict=False))


def _pct(text: str) -> float:
    return float(text.replace("%", "").strip())


def test_monitor_tells_the_truth_mid_incident(incident_server, new_page):
    server = incident_server
    page = new_page()
    page.set_viewport_size({"width": 1600, "height": 1000})
    open_page(page, server, "monitor")
    expect(page.get_by_test_id("stPlotlyChart")).to_have_count(8, timeout=30_000)
    wait_ready(page)
    assert_no_exception(page)
    kpis = _metrics(page)
    # What the DB says happened, at the three levels.
    attempts, errors = server.query("select count(*), sum(status != 'ok') from request_log")[0]
    requests, failed, fallbacks = server.query(
        "select count(*), sum(status != 'ok'), sum(fallback) from request_log where final"
    )[0]
    assert errors > 0 and fallbacks > 0
    assert _pct(kpis["Attempt error rate, last 1 h"]) == pytest.approx(100 * errors / attempts, abs=0.06)
    assert _pct(kpis["Final failure rate, last 1 h"]) == pytest.approx(100 * failed / requests, abs=0.06)
    assert _pct(kpis["Fallback rate, last 1 h"]) > 0
    # The fault change and the canary change are marked on the charts (hover text is plain).
    legend = page.locator(".legendtext").evaluate_all("els => els.map(e => e.textContent)")
    assert "fault injection" in legend and "canary change" in legend
    with rerun(page):
        page.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="Last 15 minutes").click()
    expect(page.get_by_test_id("stPlotlyChart")).to_have_count(8, timeout=30_000)
    wait_ready(page)
    assert_no_exception(page)
    screenshot(page, "monitor-incident")

    rid = server.query("select request_id from request_log where fallback and final order by ts desc limit 1")[0][0]
    open_page(page, server, f"request?id={rid}")
    expect(page.locator("h1").first).to_have_text("Request drill-down", timeout=20_000)
    expect(page.get_by_test_id("stDataFrame")).to_have_count(2, timeout=20_000)
    wait_ready(page)
    assert_no_exception(page)
    screenshot(page, "request-drilldown")


def test_the_ttft_note_fits_inside_its_chart(incident_server, new_page, tmp_path):
    """Non-streamed traffic only (the incident server's loadgen and logged failures): the
    time-to-first-token chart shows a note instead of lines; the note is wrapped so that it stays
    inside the half-width chart."""
    s = incident_server
    assert s.query("select count(*) from request_log where stream")[0][0] == 0
    page = new_page()
    open_page(page, s, "monitor")
    chart = page.get_by_test_id("stPlotlyChart").filter(has_text="Time to first token")
    note = chart.locator(".annotation-text")
    expect(note).to_contain_text("No streamed requests", timeout=20_000)
    c, n = chart.bounding_box(), note.bounding_box()
    assert c["x"] <= n["x"] and n["x"] + n["width"] <= c["x"] + c["width"], (c, n)
    chart.screenshot(path=str(tmp_path / "ttft-note.png"))
    screenshot(page, "monitor-ttft-note")
