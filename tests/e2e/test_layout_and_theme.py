"""Issue 17 point 10 in Debian chromium: ``/overview`` opens the Overview (not "Page not found"); the
browser's dark colour scheme is followed; on a 390 px phone the Overview's "Generate demo traffic"
is on the first screen and the Providers table shows its error-rate and breaker columns. Screenshots:
overview-dark.png, canary-dark.png, overview-light.png, overview-phone.png, providers-phone.png."""

from __future__ import annotations

import re

from conftest import SHOTS, assert_no_exception, open_page, screenshot
from playwright.sync_api import expect

PHONE = {"width": 390, "height": 844}


def luminance(css_rgb: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_rgb)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def background(page) -> float:
    return luminance(page.evaluate("getComputedStyle(document.querySelector('[data-testid=stApp]')).backgroundColor"))


def test_overview_opens_at_its_own_path_too(server, new_page):
    page = new_page()
    open_page(page, server, "overview")
    expect(page.locator("h1").first).to_have_text("Overview", timeout=20_000)
    assert page.get_by_text("Page not found").count() == 0
    assert page.url.rstrip("/").endswith("/overview")
    assert_no_exception(page)
    open_page(page, server, "")
    expect(page.locator("h1").first).to_have_text("Overview", timeout=20_000)
    assert page.get_by_text("Page not found").count() == 0


def test_the_browsers_colour_scheme_is_followed(server, browser):
    for scheme, check in (("dark", lambda lum: lum < 0.2), ("light", lambda lum: lum > 0.9)):
        ctx = browser.new_context(viewport={"width": 1440, "height": 1000}, color_scheme=scheme)
        try:
            page = ctx.new_page()
            open_page(page, server, "")
            expect(page.locator("h1").first).to_have_text("Overview", timeout=20_000)
            assert check(background(page)), (scheme, background(page))
            text = page.evaluate("getComputedStyle(document.querySelector('h1')).color")
            assert abs(luminance(text) - background(page)) > 0.5  # the text stays readable
            screenshot(page, f"overview-{scheme}")
            if scheme == "dark":
                open_page(page, server, "canary")
                expect(page.get_by_test_id("stPlotlyChart")).to_have_count(2, timeout=30_000)
                screenshot(page, "canary-dark")
        finally:
            ctx.close()


def test_a_phone_reaches_the_demo_button_and_the_incident_columns(fresh_server, browser):
    # The demo button is offered on a fresh install only: the shared ``server`` has logged
    # requests by the time this runs (whatever the test order), ``fresh_server`` never does.
    server = fresh_server
    ctx = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2)
    try:
        page = ctx.new_page()
        open_page(page, server, "")
        button = page.get_by_role("button", name="Generate demo traffic")
        expect(button).to_be_visible(timeout=20_000)
        box = button.bounding_box()
        assert box is not None and box["y"] + box["height"] <= PHONE["height"], box  # on the first screen
        screenshot(page, "overview-phone")

        table = page.get_by_test_id("stDataFrame").first
        table.scroll_into_view_if_needed()
        grid = table.bounding_box()
        assert grid is not None and grid["x"] >= 0 and grid["x"] + grid["width"] <= PHONE["width"]
        # The grid draws on a canvas; its accessible table holds the header cells of the columns in
        # view (it virtualises the rest away), each with its position among the columns.
        headers = table.locator('[role="columnheader"]')
        expect(headers.first).to_be_attached(timeout=20_000)
        shown = dict(
            zip(
                headers.all_text_contents(),
                (int(i) for i in headers.evaluate_all("els => els.map(e => e.getAttribute('aria-colindex'))")),
                strict=True,
            )
        )
        rate = "Attempt error rate, last 1 min"
        assert {"provider", rate, "breaker"} <= set(shown), shown
        assert shown[rate] <= 3 and shown["breaker"] <= 3, shown  # leading, so within the width
        assert "detail" not in shown  # the long columns are the ones left off-screen
        SHOTS.mkdir(exist_ok=True)
        table.screenshot(path=str(SHOTS / "providers-phone.png"))
    finally:
        ctx.close()
