"""End to end in Debian chromium against the real server: every page opens without an exception
element; a playground prompt is answered and logged; a canary change is seen by the CLI and by a
second browser; a stale tab's Apply is refused; the monitor shows loadgen traffic and updates while
open; the KV calculator reacts to its inputs; the password gate holds on a direct page URL."""

from __future__ import annotations

import json
import re

import pytest
from conftest import (
    assert_no_exception,
    commit,
    open_page,
    rerun,
    screenshot,
    wait_ready,
    wait_until,
)
from playwright.sync_api import expect

PAGES = [
    ("", "Overview"),
    ("playground", "Playground"),
    ("canary", "Canary control"),
    ("monitor", "Monitor"),
    ("kv-calculator", "KV-cache calculator"),
]


def heading(page):
    return page.locator("h1").first


def apply_ratio(page, percent: str, reason: str) -> None:
    commit(page, "Canary ratio (%)", percent)
    commit(page, "Reason (required)", reason)
    page.get_by_role("button", name="Apply", exact=True).click()


def test_every_page_opens_without_exception(server, new_page):
    page = new_page()
    for path, title in PAGES:
        open_page(page, server, path)
        expect(heading(page)).to_have_text(title, timeout=20_000)
        if path == "monitor":  # the live fragment draws its eight charts
            expect(page.get_by_test_id("stPlotlyChart")).to_have_count(8, timeout=20_000)
            wait_ready(page)
        assert_no_exception(page)
        screenshot(page, path or "overview")


def test_playground_prompt_is_answered_and_logged(server, new_page):
    page = new_page()
    open_page(page, server, "playground")
    box = page.get_by_test_id("stChatInputTextArea")
    box.fill("Write a python function that reverses a string")
    box.press("Enter")
    answer = page.get_by_test_id("stChatMessage").nth(1)
    expect(answer).to_contain_text("simulated", timeout=30_000)
    expect(answer).to_contain_text("intent coding", timeout=30_000)
    expect(answer).to_contain_text("TTFT")
    expect(answer).to_contain_text("cost $")
    wait_ready(page)
    assert_no_exception(page)
    session = page.get_by_label("Session id", exact=True).input_value()
    assert re.fullmatch(r"pg-[0-9a-f]{10}", session)
    rows = wait_until(  # the telemetry writer flushes every 0.2 s
        lambda: server.query(f"select provider, source, final from request_log where session_id = '{session}'"),
        10,
        "the playground's request_log row",
    )
    assert rows[-1][1] == "playground" and rows[-1][2] == 1
    screenshot(page, "playground-answer")


def test_canary_change_is_seen_by_the_cli_and_a_second_browser(server, new_page):
    page = new_page()
    open_page(page, server, "canary")
    apply_ratio(page, "35", "e2e: widen the canary")
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("35 %", timeout=20_000)
    assert_no_exception(page)
    shown = json.loads(server.cli("canary", "show", "--json").stdout)
    assert shown["ratio"] == pytest.approx(0.35) and shown["reason"] == "e2e: widen the canary"
    other = new_page()
    open_page(other, server, "canary")
    expect(other.get_by_test_id("stMetric").filter(has_text="Current canary ratio")).to_contain_text("35 %")
    screenshot(other, "canary-second-context")
    expect(other.get_by_label("Canary ratio (%)", exact=True)).to_have_value("35.0")
    screenshot(page, "canary-applied")


def test_stale_tab_apply_is_refused(server, new_page):
    stale, fresh = new_page(), new_page()
    open_page(stale, server, "canary")
    open_page(fresh, server, "canary")
    apply_ratio(fresh, "50", "e2e: fresh tab")
    expect(fresh.get_by_test_id("stAlertContentSuccess")).to_contain_text("50 %", timeout=20_000)
    apply_ratio(stale, "80", "e2e: stale tab")
    err = stale.get_by_test_id("stAlertContentError")
    expect(err).to_contain_text("Refused", timeout=20_000)
    expect(err).to_contain_text("local")  # the actor of an open (no accounts, no password) dashboard
    expect(err).to_contain_text("50 %")
    assert json.loads(server.cli("canary", "show", "--json").stdout)["ratio"] == pytest.approx(0.5)
    assert_no_exception(stale)
    screenshot(stale, "canary-stale-refused")


def _requests_kpi(page) -> str:
    return (
        page.get_by_test_id("stMetric").filter(has_text="Requests").first.get_by_test_id("stMetricValue").inner_text()
    )


def test_monitor_shows_loadgen_traffic_and_updates_while_open(server, new_page):
    server.loadgen(rps=30, duration_s=1, seed=1)
    page = new_page()
    open_page(page, server, "monitor")
    expect(page.get_by_test_id("stPlotlyChart").first).to_be_visible(timeout=20_000)
    expect(page.get_by_test_id("stMetric").filter(has_text="Requests").first).to_be_visible()
    before = _requests_kpi(page)
    assert int(before.replace(",", "")) >= 30
    assert_no_exception(page)
    screenshot(page, "monitor-loadgen")
    server.loadgen(rps=10, duration_s=1, seed=2)
    expect(
        page.get_by_test_id("stMetric").filter(has_text="Requests").first.get_by_test_id("stMetricValue")
    ).not_to_have_text(before, timeout=20_000)  # auto-refresh, no reload
    assert int(_requests_kpi(page).replace(",", "")) > int(before.replace(",", ""))
    assert_no_exception(page)


def _kv_metrics(page) -> dict[str, str]:
    metrics = page.get_by_test_id("stMain").get_by_test_id("stMetric")
    labels = metrics.get_by_test_id("stMetricLabel").all_inner_texts()
    values = metrics.get_by_test_id("stMetricValue").all_inner_texts()
    return {label.strip(): value.strip() for label, value in zip(labels, values, strict=True)}


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.2f} GiB ({n:,} B)"


def _kv_expected_at_16k() -> dict[str, str]:
    """The page's defaults (Llama 3.1 70B, fp8 weights and KV, 8 sequences, 2x H100 80 GB, TP 2,
    utilization 0.9, 2 GiB reserve, 16-token blocks) at 16,384 tokens, worked by hand from the
    published config (80 layers, 8 KV heads of 128) and count (70.6 B parameters)."""
    per_token = 2 * 80 * 8 * 128 * 1  # K and V, fp8: 163,840 B
    per_seq = per_token * 16384
    per_gpu_seq = 2 * 80 * (8 // 2) * 128 * 1 * 16384  # 4 KV heads on each GPU
    budget = (80 << 30) * 9 // 10 - 70_600_000_000 // 2 - (2 << 30)
    page = 16 * 2 * 4 * 128 * 1  # one layer's 16-token block on one GPU
    num_blocks = budget // page // 80
    per_request = 16384 // 16
    return {
        "Bytes per token": f"{per_token:,} B",
        "Per sequence": _gib(per_seq),
        "Total (8 seq)": _gib(8 * per_seq),
        "Per GPU (TP)": _gib(8 * per_gpu_seq),
        "Max concurrent sequences": f"{num_blocks // per_request:,}",
        "Max context at 8 seq": f"{num_blocks // 8 * 16:,} tokens",
        "vLLM steady state (per instance)": f"{num_blocks / per_request:.2f} sequences",
        "vLLM start-up log: Maximum concurrency": f"{num_blocks / per_request:.2f}x for 16,384 tokens",
    }


def test_kv_calculator_outputs_follow_inputs(server, new_page):
    page = new_page()
    open_page(page, server, "")  # see the report: a fresh server's first run of /kv-calculator misroutes
    open_page(page, server, "kv-calculator")
    expect(page.get_by_test_id("stMain").get_by_test_id("stMetricValue").first).to_be_visible(timeout=20_000)
    wait_ready(page)
    assert _kv_metrics(page)["Bytes per token"] == f"{2 * 80 * 8 * 128:,} B"
    box = page.get_by_label("Context length (tokens)", exact=True)
    expect(box).to_have_value("32768")
    box.fill("16384")
    box.press("Enter")
    expected = _kv_expected_at_16k()
    for _ in range(80):
        page.wait_for_timeout(250)
        after = _kv_metrics(page)
        if after.get("Per sequence") == expected["Per sequence"]:
            break
    wait_ready(page)
    after = _kv_metrics(page)
    if after != expected:
        screenshot(page, "kv-calculator-failed")
    assert after == expected
    assert_no_exception(page)
    screenshot(page, "kv-calculator-changed")


def test_password_gate_holds_on_a_direct_page_url(gated_server, new_page):
    gated = gated_server
    page = new_page()
    # The first request of a fresh server straight to a page URL (in a run of the whole tier):
    # Streamlit may run the page script without the entry on this run; the page's own setup must
    # still ask for the password.
    open_page(page, gated, "canary")
    expect(heading(page)).to_have_text("Sign in")
    assert page.get_by_label("Canary ratio (%)", exact=True).count() == 0
    page.get_by_label("Password", exact=True).fill("e2e-secret")
    # The heading is drawn before the sign-in's run ends, and a value typed while that run still
    # draws the page can be drawn over by it (seen in a CI run: Apply then read the stored 10 %):
    # type once the run the click started has ended.
    with rerun(page):
        page.get_by_role("button", name="Sign in").click()
    expect(heading(page)).to_have_text("Canary control", timeout=20_000)
    apply_ratio(page, "20", "e2e: gated change")
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("20 %", timeout=20_000)
    state = json.loads(gated.cli("canary", "show", "--json").stdout)
    assert state["updated_by"] == "dashboard"  # the shared password's actor, never a typed name
    other = new_page()
    open_page(other, gated, "monitor")
    expect(heading(other)).to_have_text("Sign in")
    assert_no_exception(page)
    screenshot(other, "sign-in")


def test_first_request_of_a_fresh_server_for_a_page_url_shows_that_page(fresh_server, new_page):
    """`python -m app dashboard`: a fresh server's first request straight to /kv-calculator shows
    the calculator (drawn through the entry, no "Page not found" notice), and the server listens on
    127.0.0.1 only, as .streamlit/config.toml says."""
    fresh = fresh_server
    page = new_page()
    open_page(page, fresh, "kv-calculator")
    expect(heading(page)).to_have_text("KV-cache calculator")
    expect(page.get_by_test_id("stSidebar")).to_contain_text("Canary ratio")  # the entry's sidebar
    assert page.get_by_text("Page not found").count() == 0
    assert page.get_by_role("dialog").count() == 0
    assert_no_exception(page)
    assert f"URL: {fresh.url}" in fresh.log.read_text()
    assert "Network URL" not in fresh.log.read_text()
