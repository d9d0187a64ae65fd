"""Issue 18 point 1: sign-in fails closed. With local accounts on PostgreSQL and the database made
unreachable (a TCP switch of the test's own between the dashboard and the shared test cluster,
which keeps running), a visitor gets only the "cannot verify sign-in" page: no sign-in form that
could not work, no page list, no sidebar, no data, and never the open mode's admin ``local``. When
the database answers again, the next run is the sign-in form (or the signed-in pages) again."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.db_switch import DbSwitch
from tests.unit.ui.test_entry import ENTRY, _add_account, _clear_caches, _env, _sign_in, shown, texts

REFUSAL = "Cannot verify sign-in: the database is not answering."


@pytest.fixture
def switched(tmp_path, monkeypatch, pg_url):
    """The page-test environment on PostgreSQL, reached through a switch the test turns off/on."""
    switch, url = DbSwitch.in_front_of(pg_url)
    try:
        for _ in _env(tmp_path, monkeypatch, url):
            yield switch
    finally:
        switch.close()


def visit() -> AppTest:
    return AppTest.from_file(ENTRY, default_timeout=30).run()


def assert_only_the_refusal(at: AppTest) -> None:
    assert not at.exception
    assert at.title[0].value == "Sign-in unavailable"
    assert [shown(e.value) for e in at.error] == [REFUSAL]
    assert not at.text_input and not at.metric and not at.dataframe  # no form, no data
    assert [b.label for b in at.button] == ["Try again"]
    assert not at.sidebar.children  # no page list, no canary ratio, no "Open for local use"
    assert "local" not in texts(at) and "Overview" not in texts(at)


@pytest.mark.postgres
def test_a_fresh_visitor_gets_only_the_refusal_and_the_form_comes_back(switched):
    _add_account("alice", "admin")
    assert visit().title[0].value == "Sign in"
    switched.off()
    at = visit()
    assert_only_the_refusal(at)
    button = at.button[0].click().run()  # "Try again" while still down: still refused
    assert_only_the_refusal(button)
    switched.on()
    at.run()  # what the page's own timer does in the browser (run_every never ticks in AppTest)
    assert not at.exception and at.title[0].value == "Sign in"
    assert [w.label for w in at.text_input] == ["Account name", "Password"]


@pytest.mark.postgres
def test_a_signed_in_session_is_locked_out_while_the_database_is_down(switched):
    _add_account("alice", "operator")
    at = _sign_in(visit(), "alice")
    assert at.title[0].value == "Overview"
    switched.off()
    at.run()
    assert_only_the_refusal(at)
    at.switch_page("../pages/canary.py").run()  # another page is no way round it
    assert_only_the_refusal(at)
    switched.on()
    at.run()
    assert not at.exception and at.title[0].value == "Canary control"
    assert "alice" in " ".join(c.value for c in at.sidebar.caption)


@pytest.mark.postgres
def test_dashboard_password_mode_fails_closed_too(switched, monkeypatch):
    """Without the account store, DASHBOARD_PASSWORD cannot be known to be the mode in force (an
    account added meanwhile takes precedence), so it is refused too, not asked for."""
    monkeypatch.setenv("DASHBOARD_PASSWORD", "s3cret-pass")
    assert visit().title[0].value == "Sign in"
    switched.off()
    assert_only_the_refusal(visit())


@pytest.mark.postgres
def test_a_dashboard_started_while_the_database_is_down_waits_for_it(switched):
    _add_account("alice", "viewer")
    switched.off()
    _clear_caches()  # a new process: no engine yet, and building it needs the database
    at = visit()
    assert_only_the_refusal(at)
    switched.on()
    at.run()
    assert not at.exception and at.title[0].value == "Sign in"
