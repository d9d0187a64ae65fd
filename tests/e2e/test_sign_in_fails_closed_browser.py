"""Issue 18 point 1 in Debian chromium against the real dashboard on a PostgreSQL cluster of the
test's own: with local accounts, PostgreSQL stopped, a fresh visitor sees only the "cannot verify
sign-in" page (no page list, no sidebar, no data, never the open mode's admin ``local``); PostgreSQL
started again, the same tab shows the sign-in form by itself and the account signs in.

Point 11's ``/_stcore/metrics``: the same real dashboard process refuses it without sign-in."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from conftest import assert_no_exception, open_page, rerun, screenshot, start_server, stop_server
from playwright.sync_api import expect

from tests.support.throwaway_pg import ThrowawayPostgres

PASSWORD = "pw-of-alice-123"
REFUSAL = "Cannot verify sign-in: the database is not answering."


@pytest.fixture(scope="module")
def cluster():
    with ThrowawayPostgres() as c:
        yield c


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory, cluster):
    s = start_server(tmp_path_factory.mktemp("fails-closed"), extra_env={"DATABASE_URL": cluster.url()})
    s.add_user("alice", "admin", PASSWORD)
    yield s
    stop_server(s)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_streamlit_metrics_are_refused_without_sign_in(pg_server):
    for path in ("/_stcore/metrics", "/_stcore/metrics?families=cache_memory_bytes", "//_stcore/metrics/"):
        status, body = get(pg_server.url + path)
        assert status == 403, path
        assert "# TYPE" not in body and "session" not in body.lower()
    assert get(pg_server.url + "/_stcore/health")[0] == 200  # the health check still answers


def test_database_stopped_means_only_the_refusal_until_it_is_back(pg_server, cluster, new_page):
    page = new_page()
    open_page(page, pg_server)
    expect(page.locator("h1").first).to_have_text("Sign in", timeout=20_000)

    cluster.stop()
    try:
        visitor = new_page()  # a fresh browser context: never signed in
        open_page(visitor, pg_server, "canary")
        expect(visitor.locator("h1").first).to_have_text("Sign-in unavailable", timeout=30_000)
        expect(visitor.get_by_test_id("stAlertContentError")).to_contain_text(REFUSAL)
        assert visitor.get_by_test_id("stSidebar").count() == 0
        assert visitor.get_by_test_id("stSidebarNav").count() == 0
        assert visitor.get_by_label("Password", exact=True).count() == 0
        body = visitor.locator("body").inner_text()
        for leak in ("Overview", "Canary ratio", "Open for local use", "Playground"):
            assert leak not in body, leak
        assert_no_exception(visitor)
        screenshot(visitor, "sign-in-unavailable")
    finally:
        cluster.start()

    # The same tab, untouched: its own timer looks again and the form is back.
    expect(visitor.locator("h1").first).to_have_text("Sign in", timeout=40_000)
    visitor.get_by_label("Account name", exact=True).fill("alice")
    visitor.get_by_label("Password", exact=True).fill(PASSWORD)
    with rerun(visitor):
        visitor.get_by_role("button", name="Sign in").click()
    expect(visitor.get_by_test_id("stSidebar")).to_contain_text("Signed in as alice", timeout=30_000)
    assert_no_exception(visitor)
    screenshot(visitor, "sign-in-after-database-back")
