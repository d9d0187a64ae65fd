"""The gateway server from the dashboard, in a real browser: the Overview says the server is up, an
admin creates a key on the Keys page, an application uses it through a real ``python -m app serve``
on the same database, the admin revokes it, and the server refuses it within its key cache's TTL.

And the key form as an operator types into it: Enter pressed in every field creates nothing (only
the button does, with every field as filled), the secret stays on screen through other clicks until
it is dismissed, a too-small budget is warned about, and Revoke asks before it revokes.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from conftest import assert_no_exception, open_page, rerun, screenshot, start_server, stop_server, wait_ready
from playwright.sync_api import expect

from tests.support import serve_process as sp


@pytest.fixture(scope="module")
def _dashboard_and_gateway(tmp_path_factory):
    port = sp.free_port()
    dash = start_server(tmp_path_factory.mktemp("dash"), extra_env={"GATEWAY_SERVER_URL": f"http://127.0.0.1:{port}"})
    gateway = None
    try:
        gateway = sp.start(Path(dash.env["GATEWAY_CONFIG"]), dash.database_url, port=port)
        yield dash, gateway
    finally:
        if gateway is not None:
            gateway.terminate()
        stop_server(dash)


@pytest.fixture
def dashboard_and_gateway(_dashboard_and_gateway):
    """The dashboard and a ``python -m app serve`` on its database, shared by this module's tests;
    no gateway key at the start of each test."""
    dash, _ = _dashboard_and_gateway
    with dash.engine().begin() as conn:
        for table in ("gateway_key_reservation", "gateway_key_spend", "gateway_key_window", "gateway_key"):
            conn.exec_driver_sql(f"delete from {table}")
    from db.engine import dispose_all

    dispose_all()
    return _dashboard_and_gateway


def test_an_admin_creates_a_key_an_app_uses_it_and_revoking_it_locks_the_app_out(dashboard_and_gateway, new_page):
    dash, gateway = dashboard_and_gateway
    page = new_page()
    open_page(page, dash, "overview")
    expect(page.get_by_text(f"Gateway server {gateway.base_url}: up")).to_be_visible(timeout=20_000)

    open_page(page, dash, "keys")
    expect(page.locator("h1").first).to_have_text("Gateway keys")
    page.get_by_label("Name", exact=True).fill("incident-app")
    page.get_by_label("Requests per minute (0 = no limit)", exact=True).fill("60")
    with rerun(page):
        page.get_by_role("button", name="Create key").click()
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("shown only this once")
    key = page.get_by_test_id("stCode").first.inner_text().strip()
    assert key.startswith("gw-")
    screenshot(page, "keys-created")

    app = openai.OpenAI(api_key=key, base_url=gateway.base_url, max_retries=0, timeout=30)
    answer = app.chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=[{"role": "user", "content": "hello from the app"}]
    )
    assert answer.http_response.status_code == 200 and answer.parse().choices[0].message.content
    assert answer.http_response.headers["x-gateway-request-id"]

    open_page(page, dash, "keys")  # a later visit lists the key (spend included), never the key itself
    expect(page.get_by_test_id("stDataFrame")).to_be_visible()
    assert key not in page.content()
    page.get_by_test_id("stSelectbox").last.click()  # "Key", in the Revoke form
    page.get_by_role("option", name="incident-app").click()
    with rerun(page):
        page.get_by_role("button", name="Revoke").click()
    with rerun(page):
        page.get_by_role("button", name="Yes, revoke 'incident-app'").click()
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("Revoked 'incident-app'")
    screenshot(page, "keys-revoked")
    assert_no_exception(page)

    def refused() -> bool:
        try:
            app.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "again"}])
        except openai.AuthenticationError:
            return True
        return False

    sp.wait_for(refused, timeout_s=15, what="the revoked key to be refused (401)")


@pytest.fixture
def dashboard(dashboard_and_gateway):
    return dashboard_and_gateway[0]


def choose_revoke_key(page, name: str) -> None:
    """Pick ``name`` in the Revoke form's "Key" box (the page's last selectbox). A click that lands
    while the page is still re-rendering can leave the list closed: open it again, a few times."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    for _ in range(4):
        page.get_by_test_id("stSelectbox").last.click()
        try:
            page.get_by_role("option", name=name).click(timeout=10_000)
            return
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")
            wait_ready(page)
    raise AssertionError(f"the Revoke form's Key list never offered {name!r}")


def key_rows(dash) -> list[tuple]:
    return dash.query("select name, rpm, tpm, budget_micro_usd, budget_period, revoked_at from gateway_key order by id")


def test_enter_never_submits_the_key_form_the_secret_stays_and_revoke_confirms(dashboard, new_page):
    dash = dashboard
    page = new_page()
    open_page(page, dash, "keys")
    expect(page.locator("h1").first).to_have_text("Gateway keys")
    fields = [
        ("Name", "ops-tiny"),
        ("Requests per minute (0 = no limit)", "60"),
        ("Tokens per minute (0 = no limit)", "5000"),
        ("Budget USD (0 = none)", "0.01"),
    ]
    for label, value in fields:  # Enter after each field, as the operator in the issue did
        box = page.get_by_label(label, exact=True)
        box.fill(value)
        box.press("Enter")
        wait_ready(page)
    page.get_by_test_id("stSelectbox").first.click()  # "Budget period"
    page.get_by_role("option", name="day").click()
    page.get_by_label("Name", exact=True).press("Enter")
    wait_ready(page)
    assert page.get_by_test_id("stAlertContentSuccess").count() == 0
    assert key_rows(dash) == []  # nothing created, half-filled or otherwise
    screenshot(page, "keys-form-filled-enter-pressed")

    with rerun(page):
        page.get_by_role("button", name="Create key").click()
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("shown only this once")
    # One key, with every field as filled: none of the Enters submitted a part of the form.
    assert key_rows(dash) == [("ops-tiny", 60, 5000, 10_000, "day", None)]
    secret = page.get_by_test_id("stCode").first.inner_text().strip()
    assert secret.startswith("gw-")
    warning = page.get_by_test_id("stAlertContentWarning").first
    expect(warning).to_contain_text("smaller than one request's worst case")
    expect(warning).to_contain_text("max_tokens")
    expect(page.get_by_role("button", name="Create key")).to_be_disabled()

    # Enter in the form again, and a click elsewhere on the page: the secret stays.
    page.get_by_label("Name", exact=True).press("Enter")
    wait_ready(page)
    choose_revoke_key(page, "ops-tiny")  # a choice inside a form: no run to wait for
    wait_ready(page)
    expect(page.get_by_test_id("stCode").first).to_have_text(secret)
    screenshot(page, "keys-secret-stays")

    with rerun(page):
        page.get_by_role("button", name="I have stored the key: hide it").click()
    expect(page.get_by_text(secret)).to_have_count(0)
    expect(page.get_by_label("Name", exact=True)).to_have_value("")
    assert len(key_rows(dash)) == 1

    # Revoke asks first; Cancel revokes nothing; Yes revokes.
    choose_revoke_key(page, "ops-tiny")
    with rerun(page):
        page.get_by_role("button", name="Revoke", exact=True).click()
    expect(page.get_by_test_id("stAlertContentWarning").first).to_contain_text("Revoke 'ops-tiny'?")
    assert key_rows(dash)[0][5] is None
    screenshot(page, "keys-revoke-confirm")
    with rerun(page):
        page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("button", name="Yes, revoke 'ops-tiny'")).to_have_count(0)
    assert key_rows(dash)[0][5] is None
    choose_revoke_key(page, "ops-tiny")
    with rerun(page):
        page.get_by_role("button", name="Revoke", exact=True).click()
    with rerun(page):
        page.get_by_role("button", name="Yes, revoke 'ops-tiny'").click()
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("Revoked 'ops-tiny'")
    assert key_rows(dash)[0][5] is not None
    assert_no_exception(page)
