"""An upstream's error message in Debian chromium: a provider answering with markdown image and
link syntax in its error never makes the browser fetch an image or follow a link, on the Playground
that shows the error and on every page that shows text (a server of its own, behind a chaos
upstream). A stored canary reason: test_operator_truth.py."""

from __future__ import annotations

from conftest import (
    REPO,
    open_page,
    screenshot,
    seen_text,
    start_server,
    stop_server,
    visit_everywhere_text_is_shown,
    wait_until,
)
from playwright.sync_api import expect


def test_an_upstream_error_message_never_loads_an_image(tmp_path, new_page, pixel):
    import sys

    sys.path.insert(0, str(REPO))
    from tests.support.chaos_upstream import ChaosUpstream, bad_request

    evil = f"bad model ![x]({pixel.url}/error-pixel) [click]({pixel.url}/link)"
    with ChaosUpstream(default=bad_request(evil)) as up:
        config = f"""
[routing]
primary = "alpha"
fallback = "beta"

[providers.alpha]
base_url = "{up.base_url("alpha")}"
api_key_env = "ALPHA_KEY"
models = ["gpt-4.1"]
default_model = "gpt-4.1"

[providers.beta]
base_url = "{up.base_url("beta")}"
api_key_env = "BETA_KEY"
models = ["gpt-4.1"]
default_model = "gpt-4.1"
"""
        s = start_server(tmp_path / "upstream", {"ALPHA_KEY": "k1", "BETA_KEY": "k2"}, config_text=config)
        try:
            page = new_page()
            open_page(page, s, "playground")
            box = page.get_by_test_id("stChatInputTextArea")
            box.fill("hello")
            box.press("Enter")
            err = page.get_by_test_id("stChatMessage").nth(1).get_by_test_id("stAlertContentError")
            expect(err).to_contain_text("All routes failed", timeout=30_000)
            expect(err).to_contain_text("error-pixel")
            assert f"![x]({pixel.url}/error-pixel)" in seen_text(err)
            assert err.locator("a").count() == 0  # neither the [click](...) link nor a bare address links
            screenshot(page, "playground-inert-error")
            wait_until(lambda: s.query("select count(*) from request_log")[0][0] > 0, 10, "the failed attempts logged")
            visit_everywhere_text_is_shown(page, s)
            assert pixel.hits == []
        finally:
            stop_server(s)
