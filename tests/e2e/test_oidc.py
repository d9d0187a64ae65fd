"""Sign-in through Streamlit's own ``st.login`` (OpenID Connect, Authlib) against a local OpenID
provider (``oidc-provider-mock`` on loopback), in Debian chromium: the identity is the token's
e-mail, the role comes from the ``roles`` claim or the ``[dashboard.roles]`` lists (default viewer),
and the actor recorded on a change is that identity."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import REPO, assert_no_exception, free_port, open_page, rerun, screenshot, start_server, stop_server
from playwright.sync_api import expect

oidc_provider_mock = pytest.importorskip("oidc_provider_mock")
pytest.importorskip("authlib")


@pytest.fixture(scope="module")
def oidc_dashboard(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("oidc")
    users = [
        oidc_provider_mock.User(sub="ann", claims={"email": "ann@example.com", "roles": ["operator"]}),
        oidc_provider_mock.User(sub="vlad", claims={"email": "vlad@example.com"}),
        oidc_provider_mock.User(sub="boss", claims={"email": "boss@example.com"}),
    ]
    with oidc_provider_mock.run_server_in_thread(user_claims=users) as provider:
        port = free_port()
        (tmp / ".streamlit").mkdir()
        shutil.copy(REPO / ".streamlit" / "config.toml", tmp / ".streamlit" / "config.toml")
        (tmp / ".streamlit" / "secrets.toml").write_text(
            f"""
[auth]
redirect_uri = "http://127.0.0.1:{port}/oauth2callback"
cookie_secret = "e2e-cookie-secret-that-is-long-enough"
client_id = "llm-gateway-dashboard"
client_secret = "e2e-client-secret"
server_metadata_url = "http://localhost:{provider.server_port}/.well-known/openid-configuration"
"""
        )
        config = (REPO / "gateway.toml").read_text() + (
            '\n[simulator]\nlatency_scale = 0.05\n\n[dashboard.roles]\nclaim = "roles"\nadmins = ["boss@example.com"]\n'
        )
        server = start_server(tmp / "run", config_text=config, cwd=tmp, port=port)
        yield server
        stop_server(server)


def sign_in_as(page, server, sub: str) -> None:
    open_page(page, server, "canary")
    expect(page.locator("h1").first).to_have_text("Sign in")
    page.get_by_role("button", name="Sign in with your identity provider").click()
    page.wait_for_url("**/oauth2/authorize**", timeout=20_000)
    page.get_by_role("button", name=sub, exact=True).click()
    page.wait_for_url(f"{server.url}/**", timeout=20_000)
    expect(page.locator("h1").first).not_to_have_text("Sign in", timeout=30_000)


def test_an_operator_from_the_identity_provider_changes_the_canary(oidc_dashboard, new_page):
    s = oidc_dashboard
    page = new_page()
    open_page(page, s, "canary")
    screenshot(page, "sign-in-oidc")
    sign_in_as(page, s, "ann")
    expect(page.get_by_test_id("stSidebar")).to_contain_text("Signed in as ann@example.com (operator)")
    open_page(page, s, "canary")
    box = page.get_by_label("Canary ratio (%)", exact=True)
    with rerun(page):
        box.fill("40")
        box.press("Enter")
    reason = page.get_by_label("Reason (required)", exact=True)
    with rerun(page):
        reason.fill("e2e: oidc change")
        reason.press("Enter")
    with rerun(page):
        page.get_by_role("button", name="Apply", exact=True).click()
    expect(page.get_by_test_id("stAlertContentSuccess")).to_contain_text("40 %")
    assert json.loads(s.cli("canary", "show", "--json").stdout)["updated_by"] == "ann@example.com"
    assert_no_exception(page)
    screenshot(page, "canary-oidc-operator")


@pytest.mark.parametrize("sub, role", [("vlad", "viewer"), ("boss", "admin")])
def test_roles_come_from_the_config_lists_else_viewer(oidc_dashboard, new_page, sub, role):
    page = new_page()
    sign_in_as(page, oidc_dashboard, sub)
    expect(page.get_by_test_id("stSidebar")).to_contain_text(f"Signed in as {sub}@example.com ({role})")
    open_page(page, oidc_dashboard, "canary")
    apply = page.locator("button", has_text="Apply").first
    if role == "viewer":
        expect(apply).to_be_disabled()
        expect(page.get_by_test_id("stAlertContentInfo").first).to_contain_text("viewer role")
    else:
        expect(apply).to_be_enabled()
    assert_no_exception(page)
