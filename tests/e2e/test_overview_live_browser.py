"""Issue 17 (one live picture) in Chromium: with errors injected on the primary and loadgen
traffic from another process, the Overview, opened once and never reloaded, raises a red banner
naming the failing provider and the incident's start (UTC), and its figures carry their spans.
Screenshots at 1440 px and 390 px: overview-incident-1440.png, overview-incident-390.png."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

from conftest import REPO, assert_no_exception, open_page, screenshot, start_server, stop_server, wait_ready
from playwright.sync_api import expect

BANNER = re.compile(r"holysheep: incident since (\d\d:\d\d:\d\d) UTC")


def test_the_overview_raises_the_banner_by_itself(tmp_path, new_page):
    config = (REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0.05\n\n[dashboard]\nrefresh_s = 2\n"
    server = start_server(tmp_path, config_text=config)
    loadgen = None
    try:
        server.set_ratio(0.5, "drill: half the traffic on the primary")
        page = new_page()
        page.set_viewport_size({"width": 1440, "height": 1000})
        open_page(page, server, "")
        assert_no_exception(page)
        expect(page.get_by_text("Attempt error rate, last 1 min", exact=True).first).to_be_visible()
        assert page.get_by_test_id("stAlertContentError").count() == 0
        page.evaluate("window.__sameDocument = true")  # gone if the page reloads

        from app.dashboard.canary_form import save_faults
        from app.dashboard.identity import Identity
        from db.engine import dispose_all, get_engine

        engine = get_engine(server.database_url)
        assert save_faults(engine, "holysheep", 80, 0, 1, actor=Identity("e2e-operator", "operator", "account")).ok
        dispose_all()
        loadgen = subprocess.Popen(
            # Runs until the page has been watched (then stopped), not for a fixed span.
            [sys.executable, "-m", "app", "loadgen", "--rps", "4", "--duration", "300", "--seed", "5", "--quiet"],
            cwd=REPO,
            env=server.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        banner = page.get_by_test_id("stAlertContentError").filter(has_text=BANNER)
        expect(banner).to_be_visible(timeout=60_000)  # no reload, no click: the fragment's own refresh
        assert page.evaluate("window.__sameDocument === true")
        text = banner.inner_text().replace("\u2060", "")
        assert "Attempt error rate, last 1 min:" in text and "Errors seen since the start:" in text
        assert "direct" not in next(line for line in text.split("\n") if BANNER.search(line))
        # The start is the first failed attempt on holysheep (the breaker opened after it).
        sql = "select min(ts) from request_log where provider = 'holysheep' and status != 'ok'"
        first_failure = server.query(sql)[0][0]
        assert first_failure is not None
        since = BANNER.search(text)
        assert since is not None and since.group(1) == time.strftime("%H:%M:%S", time.gmtime(first_failure)), text
        # The empty-log offer went away by itself once loadgen's traffic arrived.
        expect(page.get_by_role("button", name="Generate demo traffic")).to_have_count(0, timeout=20_000)
        wait_ready(page)
        assert_no_exception(page)
        box = banner.bounding_box()
        assert box is not None and box["y"] < 400  # at the top of the page
        screenshot(page, "overview-incident-1440")

        page.set_viewport_size({"width": 390, "height": 844})
        wait_ready(page)
        expect(banner).to_be_visible()
        box = banner.bounding_box()
        assert box is not None and box["y"] + 40 < 844 and box["x"] >= 0 and box["x"] + box["width"] <= 390
        screenshot(page, "overview-incident-390")
        assert page.evaluate("window.__sameDocument === true")
        # Stopped as an operator stops it: the schedule ends, the requests in flight are logged and
        # the report goes out, the exit status saying which signal ended it.
        loadgen.terminate()
        out, err = loadgen.communicate(timeout=120)
        assert loadgen.returncode == 128 + signal.SIGTERM, err
        report = json.loads(out)
        assert report["interrupted"] == "SIGTERM" and report["sent"] > 0, report
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.terminate()
            loadgen.wait(10)
        stop_server(server)
