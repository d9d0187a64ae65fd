"""The gateway server from the dashboard, in a real browser: the Overview says the server is up, an
admin creates a key on the Keys page, an application uses it through a real ``python -m app serve``
on the same database, the admin revokes it, and the server refuses it within its key cache's TTL.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from conftest import assert_no_exception, open_page, rerun, screenshot, start_server, stop_server
from playwright.sync_api import expect

from tests.support import serve_process as sp


@pytest.fixture
def dashboard_and_gateway(tmp_path):
    port = sp.free_port()
    dash = start_server(tmp_path / "dash", extra_env={"GATEWAY_SERVER_URL": f"http://127.0.0.1:{port}"})
    gateway = None
    try:
        gateway = sp.start(Path(dash.env["GATEWAY_CONFIG"]), dash.database_url, port=port)
        yield dash, gateway
    finally:
        if gateway is not None:
            gateway.terminate()
        stop_server(dash)


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
