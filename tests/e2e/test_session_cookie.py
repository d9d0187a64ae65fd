"""Issue 17 point 9 in Debian chromium against the real server: a local-account sign-in survives a
reload and a link opened in a new tab (an HttpOnly, SameSite=Strict cookie set by the dashboard's
own route), and stops working after sign-out, after the account is removed and after a role
change made by another process (this one, as ``python -m app users ...`` makes them). A tampered
cookie just shows the sign-in form. The token is never in a URL."""

from __future__ import annotations

import pytest
from conftest import ACCOUNTS, assert_no_exception, open_page, rerun, screenshot, wait_until, watch_context
from playwright.sync_api import expect

COOKIE = "gateway_session"
PASSWORDS = {name: password for name, (_, password) in ACCOUNTS.items()}


@pytest.fixture
def context(browser):
    ctx = watch_context(browser.new_context(viewport={"width": 1400, "height": 1000}))
    yield ctx
    ctx.close()


def session_cookie(ctx) -> dict | None:
    return next((c for c in ctx.cookies() if c["name"] == COOKIE), None)


def sign_in(page, server, name: str, path: str = "canary") -> None:
    open_page(page, server, path)
    expect(page.locator("h1").first).to_have_text("Sign in")
    page.get_by_label("Account name", exact=True).fill(name)
    page.get_by_label("Password", exact=True).fill(PASSWORDS[name])
    with rerun(page):
        page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("stSidebar")).to_contain_text(f"Signed in as {name}", timeout=20_000)
    # The browser collects the cookie right after the sign-in run; wait for it, never assume it.
    wait_until(lambda: session_cookie(page.context), 20, "the session cookie")


def expect_signed_in(page, name: str, title: str) -> None:
    expect(page.locator("h1").first).to_have_text(title, timeout=20_000)
    expect(page.get_by_test_id("stSidebar")).to_contain_text(f"Signed in as {name}")
    assert_no_exception(page)


def expect_sign_in_form(page) -> None:
    expect(page.locator("h1").first).to_have_text("Sign in", timeout=20_000)
    expect(page.get_by_label("Password", exact=True)).to_be_visible()


def test_reload_and_new_tab_stay_signed_in_until_sign_out(accounts_server, context):
    s = accounts_server
    page = context.new_page()
    sign_in(page, s, "olga")
    cookie = session_cookie(context)
    assert cookie is not None
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert cookie["expires"] > 0  # a bounded lifetime, not a browser-session cookie
    assert cookie["value"] not in page.url
    assert page.evaluate("document.cookie").find(COOKIE) == -1  # page scripts cannot read it

    page.reload()
    page.wait_for_selector('[data-testid="stApp"][data-test-script-state="notRunning"]')
    expect_signed_in(page, "olga", "Canary control")
    screenshot(page, "session-after-reload")

    # A drill-down link opened in a new tab of the same browser.
    tab = context.new_page()
    open_page(tab, s, "request?id=does-not-exist")
    expect(tab.get_by_test_id("stSidebar")).to_contain_text("Signed in as olga", timeout=20_000)
    assert tab.locator("h1").first.inner_text() != "Sign in"
    assert_no_exception(tab)
    screenshot(tab, "session-new-tab")
    tab.close()

    with rerun(page):
        page.get_by_role("button", name="Sign out").click()
    expect_sign_in_form(page)
    wait_until(lambda: session_cookie(context) is None, 20, "the cookie to be dropped after sign-out")
    page.reload()
    expect_sign_in_form(page)


def test_a_revoked_cookie_replayed_after_sign_out_does_not_sign_in(accounts_server, browser, context):
    s = accounts_server
    page = context.new_page()
    sign_in(page, s, "olga")
    stolen = session_cookie(context)
    with rerun(page):
        page.get_by_role("button", name="Sign out").click()
    expect_sign_in_form(page)
    # Another browser holding a copy of the old cookie: the sign-out revoked it server-side.
    other = browser.new_context()
    try:
        other.add_cookies([stolen])
        p2 = other.new_page()
        open_page(p2, s, "canary")
        expect_sign_in_form(p2)
    finally:
        other.close()


@pytest.mark.parametrize(
    "name,change",
    [("rita", lambda accounts: accounts.set_role("rita", "viewer")), ("sam", lambda accounts: accounts.remove("sam"))],
    ids=["role-change", "account-removed"],
)
def test_a_change_in_another_process_revokes_the_cookie(accounts_server, context, name, change):
    """The change is made in this process, as ``python -m app users set-role|remove`` makes it (the
    commands' own tests are in tests/integration/app/test_main.py)."""
    from app.accounts import Accounts
    from db.engine import dispose_all

    s = accounts_server
    page = context.new_page()
    sign_in(page, s, name)
    change(Accounts(s.engine()))
    dispose_all()
    page.reload()
    expect_sign_in_form(page)
    screenshot(page, f"session-revoked-{name}")


def test_a_tampered_cookie_just_asks_for_the_password(accounts_server, context):
    s = accounts_server
    page = context.new_page()
    sign_in(page, s, "olga")
    cookie = session_cookie(context)
    body, signature = cookie["value"].split(".")
    forged = body[:-2] + ("AA" if body[-2:] != "AA" else "BB") + "." + signature
    context.add_cookies([{**cookie, "value": forged}])
    page.reload()
    expect_sign_in_form(page)
    assert_no_exception(page)


def test_the_session_route_refuses_other_origins_and_unknown_codes(accounts_server, context):
    s = accounts_server
    api = context.request
    assert (
        api.post(f"{s.url}/_gateway/session", data={"code": "x"}, headers={"Origin": "http://evil.example"}).status
        == 403
    )
    assert api.post(f"{s.url}/_gateway/session", data={"code": "not-a-code"}, headers={"Origin": s.url}).status == 400
    big = {"code": "x" * 5000}
    assert api.post(f"{s.url}/_gateway/session", data=big, headers={"Origin": s.url}).status == 413
    assert session_cookie(context) is None
