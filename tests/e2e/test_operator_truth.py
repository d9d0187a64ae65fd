"""Issue 8 in Debian chromium against the real server: every write is validated before it is
written and says so next to the field (canary ratio, guardrail, fault injection, playground max
tokens); a change to the current value is refused; the shared password is throttled (local
accounts: test_sign_in_browser.py); untrusted text (a canary reason, an upstream error) never makes
the browser fetch an image (an upstream's error: test_upstream_error_browser.py)."""

from __future__ import annotations

import pytest
from conftest import (
    assert_no_exception,
    commit,
    open_page,
    rerun,
    screenshot,
    seen_text,
    visit_everywhere_text_is_shown,
)
from playwright.sync_api import expect


def type_into(page, label: str, typed: str) -> None:
    """Clear the field labelled ``label`` and type ``typed`` key by key, as an operator does (a
    number field drops the keys it does not take), then Enter."""
    box = page.get_by_label(label, exact=True).first
    with rerun(page):
        box.click()
        box.press("Control+a")
        box.press("Backspace")
        box.press_sequentially(typed)
        box.press("Enter")


def audit_rows(server) -> int:
    return server.query("select count(*) from canary_audit")[0][0]


def error_under(page, label: str):
    """The error alert drawn right under the input labelled ``label`` (asserted by position)."""
    field = page.get_by_label(label, exact=True).first
    box = field.bounding_box()
    alerts = page.get_by_test_id("stAlertContentError")
    for i in range(alerts.count()):
        a = alerts.nth(i).bounding_box()
        if (
            a
            and box
            and a["y"] > box["y"]
            and a["y"] - (box["y"] + box["height"]) < 120
            and abs(a["x"] - box["x"]) < 80
        ):
            return alerts.nth(i)
    raise AssertionError(f"no error alert right under {label!r}")


# What the browser makes of the keys typed into the number field: a number out of range, letters
# (which the field drops: an empty field), a number too large for a double. The other values the
# server refuses (-5, NaN, infinity, an empty field, no change, no reason) are the AppTest tests'
# in tests/unit/ui/test_entry.py.
@pytest.mark.parametrize("typed", ["150", "twenty", "1e400"])
def test_canary_bad_ratio_is_refused_next_to_the_field_and_nothing_written(server, new_page, typed):
    page = new_page()
    open_page(page, server, "canary")
    expect(page.get_by_role("spinbutton", name="Canary ratio (%)")).to_be_visible()  # DESIGN: a number input
    before, rows = server.canary_row(), audit_rows(server)
    type_into(page, "Canary ratio (%)", typed)
    expect(error_under(page, "Canary ratio (%)")).to_contain_text("Canary ratio must be")
    commit(page, "Reason (required)", "operator typo: meant 15")
    with rerun(page):
        page.get_by_role("button", name="Apply", exact=True).click()
    err = error_under(page, "Canary ratio (%)")
    expect(err).to_contain_text("Nothing was written")
    assert page.get_by_test_id("stAlertContentSuccess").count() == 0
    assert server.canary_row() == before and audit_rows(server) == rows
    assert_no_exception(page)
    if typed in ("150", "twenty"):
        screenshot(page, f"canary-refused-{typed}")


def test_canary_current_value_is_refused_as_no_change(server, new_page):
    page = new_page()
    open_page(page, server, "canary")
    before, rows = server.canary_row(), audit_rows(server)
    # The field shows the stored ratio (waited for: the number field can be drawn before its value).
    ratio = server.query("select ratio from canary_setting where scope = 'global'")[0][0]
    expect(page.get_by_label("Canary ratio (%)", exact=True)).to_have_value(f"{ratio * 100:.1f}")
    commit(page, "Reason (required)", "same again")
    with rerun(page):
        page.get_by_role("button", name="Apply", exact=True).click()
    expect(error_under(page, "Canary ratio (%)")).to_contain_text("No change")
    assert server.canary_row() == before and audit_rows(server) == rows
    screenshot(page, "canary-no-change")


def _guardrail_row(server):
    return server.query("select error_rate_threshold, window_minutes, min_requests from guardrail_setting")


def test_guardrail_threshold_zero_is_refused_next_to_the_field(server, new_page):
    page = new_page()
    open_page(page, server, "canary")
    before = _guardrail_row(server)
    page.get_by_label("Error-rate threshold (%)", exact=True).fill("0")
    with rerun(page):
        page.get_by_role("button", name="Save guardrail").click()
    expect(error_under(page, "Error-rate threshold (%)")).to_contain_text("above 0")
    assert _guardrail_row(server) == before
    assert_no_exception(page)
    screenshot(page, "guardrail-refused")


@pytest.mark.parametrize(
    "label, typed, needle",
    [("Error rate (%)", "150", "Error rate must be"), ("Latency multiplier", "0", "between 0.1 and 100")],
)
def test_fault_injection_bad_values_are_refused_next_to_the_field(server, new_page, label, typed, needle):
    page = new_page()
    open_page(page, server, "canary")
    form = page.get_by_test_id("stForm").filter(has_text="holysheep")
    form.get_by_label(label, exact=True).fill(typed)
    with rerun(page):
        form.get_by_role("button", name="Save faults").click()
    alert = form.get_by_test_id("stAlertContentError")
    expect(alert).to_contain_text(needle)
    expect(alert).to_contain_text("Nothing was written")
    field_box = form.get_by_label(label, exact=True).bounding_box()
    alert_box = alert.bounding_box()
    assert 0 < alert_box["y"] - (field_box["y"] + field_box["height"]) < 120  # right under the field
    assert server.query("select count(*) from sim_fault where provider = 'holysheep'")[0][0] == 0
    screenshot(page, f"faults-refused-{typed}")


def test_playground_max_tokens_zero_is_refused_and_nothing_sent(server, new_page):
    page = new_page()
    open_page(page, server, "playground")
    sent = server.query("select count(*) from request_log where source = 'playground'")[0][0]
    commit(page, "Max tokens", "0")
    expect(page.get_by_test_id("stSidebar").get_by_test_id("stAlertContentError")).to_contain_text(
        "Max tokens must be a whole number from 1 to 32768"
    )
    box = page.get_by_test_id("stChatInputTextArea")
    with rerun(page):
        box.fill("hello")
        box.press("Enter")
    expect(page.get_by_test_id("stMainBlockContainer").get_by_test_id("stAlertContentError")).to_contain_text(
        "Not sent"
    )
    assert page.get_by_test_id("stChatMessage").count() == 0
    assert server.query("select count(*) from request_log where source = 'playground'")[0][0] == sent
    screenshot(page, "playground-max-tokens-0")


# -- identities ---------------------------------------------------------------------------------------


def test_the_shared_password_is_throttled_too(gated_server, new_page):
    gated = gated_server
    page = new_page()
    messages = []
    for i in range(3):
        open_page(page, gated, "")
        page.get_by_label("Password", exact=True).fill(f"guess {i}")
        with rerun(page):
            page.get_by_role("button", name="Sign in").click()
        messages.append(page.get_by_test_id("stAlertContentError").inner_text())
    assert messages[:2] == ["Wrong password."] * 2 and "next try in 1 s" in messages[2]
    assert gated.query("select key from signin_throttle") == [("password",)]


# -- untrusted text ------------------------------------------------------------------------------------


def test_a_stored_reason_never_loads_an_image(fresh_server, new_page, pixel):
    """On a server the shared ``server``'s tests never touched: a stored reason of its own (and no
    request sent, as ``fresh_server`` requires)."""
    evil = f"![x]({pixel.url}/reason-pixel) <img src={pixel.url}/reason-img> :red[alarm]"
    s = fresh_server
    s.set_ratio(0.3, evil, actor=f"![a]({pixel.url}/actor-pixel)")
    page = new_page()
    visit_everywhere_text_is_shown(page, s)
    open_page(page, s, "canary")
    expect(page.get_by_test_id("stMainBlockContainer")).to_contain_text("reason-pixel")
    assert f"![x]({pixel.url}/reason-pixel)" in seen_text(page.get_by_test_id("stMainBlockContainer"))
    screenshot(page, "canary-inert-reason")
    assert pixel.hits == []
    assert page.locator(f'img[src^="{pixel.url}"]').count() == 0
    assert page.locator(f'a[href^="{pixel.url}"]').count() == 0
