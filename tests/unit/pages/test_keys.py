"""AppTest tests of the Keys page (create shows the key once, revoke, refusals) and of the Overview's
gateway-server line; the logic behind them (app.keys, app.server.probe) is tested without Streamlit."""

from __future__ import annotations

import httpx2
import pytest

from app import keys
from app.server.probe import server_status
from db.keys import list_keys, lookup_key
from tests.unit.ui.test_entry import engine, env, open_app  # noqa: F401 - env is a fixture

NO_SERVER = "http://127.0.0.1:9"  # the unit tier refuses every connection: nothing listens

PAGE = "../pages/keys.py"


def form_button(at, label):
    return next(b for b in at.button if b.label == label)


def test_keys_page_creates_a_key_shown_until_dismissed_and_revokes_it_after_confirming(env, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GATEWAY_SERVER_URL", NO_SERVER)
    at = open_app(PAGE)
    assert at.title[0].value == "Gateway keys"
    assert "No gateway keys yet" in at.info[0].value
    at.text_input[0].set_value("team-a")
    at.multiselect[0].set_value(["gpt-4.1"])
    at.number_input[0].set_value(30)
    form_button(at, "Create key").click().run()
    assert not at.exception
    shown = at.code[0].value
    assert shown.startswith("gw-") and lookup_key(engine(), shown).name == "team-a"
    assert "shown only this once" in at.success[0].value
    assert not at.warning  # no budget: nothing to warn about
    table = at.dataframe[0].value
    assert list(table["name"]) == ["team-a"] and list(table["models"]) == ["gpt-4.1"]
    assert list(table["requests/min"]) == ["30"] and list(table["tokens/min"]) == ["no limit"]
    assert list(table["status"]) == ["active"] and table["created"].iloc[0].endswith(" UTC")
    assert shown not in table.to_string()  # only the prefix is listed
    assert form_button(at, "Create key").disabled  # a second Create would push the secret off screen
    at.run()
    at.selectbox[1].set_value("team-a").run()  # other interactions keep the secret on screen
    assert at.code[0].value == shown
    form_button(at, "I have stored the key: hide it").click().run()
    assert not any(c.value == shown for c in at.code)
    assert at.text_input[0].value == "" and at.number_input[0].value == 0  # the form is empty again
    assert not form_button(at, "Create key").disabled

    at.selectbox[1].set_value("team-a")
    form_button(at, "Revoke").click().run()
    assert not at.exception
    assert "Revoke 'team-a'?" in at.warning[0].value
    assert [k.active for k in list_keys(engine())] == [True]  # nothing revoked before the confirmation
    form_button(at, "Cancel").click().run()
    assert not at.warning and [k.active for k in list_keys(engine())] == [True]
    at.selectbox[1].set_value("team-a")
    form_button(at, "Revoke").click().run()
    form_button(at, "Yes, revoke 'team-a'").click().run()
    assert not at.exception
    assert "Revoked 'team-a'" in at.success[0].value
    assert [k.active for k in list_keys(engine())] == [False]
    assert lookup_key(engine(), shown) is None


def test_a_budget_smaller_than_one_worst_case_request_is_warned_at_creation(env):  # noqa: F811
    at = open_app(PAGE)
    at.text_input[0].set_value("tiny")
    at.multiselect[0].set_value(["gpt-4.1"])
    at.number_input[2].set_value(0.01)
    at.selectbox[0].set_value("day")
    form_button(at, "Create key").click().run()
    assert not at.exception and at.code[0].value.startswith("gw-")
    warning = at.warning[0].value
    assert "$0.01 per day" in warning and "smaller than one request's worst case" in warning
    assert "32,768 tokens, $0.2621" in warning and "must set max_tokens (at most 1,250 on gpt-4.1" in warning


def test_keys_page_refuses_a_bad_name_and_writes_nothing(env):  # noqa: F811
    at = open_app(PAGE)
    at.text_input[0].set_value("bad name!")
    form_button(at, "Create key").click().run()
    assert "not valid" in at.error[0].value and "Fix:" in at.error[0].value
    assert list_keys(engine()) == []


def test_create_from_form_maps_zero_to_no_limit(sqlite_url):
    from db.engine import get_engine

    eng = get_engine(sqlite_url)
    out = keys.create_from_form(eng, name="k1", models=[], rpm=0, tpm=0, budget_usd=0.0, period="month", actor="alice")
    assert out.ok and out.key
    rec = list_keys(eng)[0]
    assert (rec.rpm, rec.tpm, rec.budget_usd, rec.period, rec.models, rec.created_by) == (
        None,
        None,
        None,
        None,
        (),
        "alice",
    )
    dup = keys.create_from_form(eng, name="k1", models=[], rpm=0, tpm=0, budget_usd=0.0, period="day", actor="a")
    assert not dup.ok and "already exists" in dup.message
    assert keys.revoke_from_form(eng, "nope")[0] is False
    budget = keys.create_from_form(
        eng, name="k2", models=["gpt-4.1"], rpm=5, tpm=0, budget_usd=2.5, period="day", actor="a"
    )
    assert budget.ok and budget.warning is None  # $2.5 holds a worst-case gpt-4.1 request ($0.26)
    tiny = keys.create_from_form(eng, name="k3", models=[], rpm=0, tpm=0, budget_usd=0.05, period="month", actor="a",
                                 servable=["gemini-2.5-flash", "gpt-4.1"])  # fmt: skip
    assert tiny.ok and tiny.warning and "a request to gpt-4.1 that sets no max_tokens" in tiny.warning
    row = next(r for r in keys.rows(eng) if r.name == "k2")
    assert row.budget == "$2.5 / day" and row.budget_used_usd == 0 and row.models == "gpt-4.1"


def test_overview_shows_the_gateway_server_address_and_state(env, monkeypatch):  # noqa: F811
    monkeypatch.setenv("GATEWAY_SERVER_URL", NO_SERVER)
    at = open_app()
    line = next(c.value for c in at.caption if "Gateway server" in c.value)
    assert f"{NO_SERVER}/v1" in line and "down" in line


@pytest.mark.parametrize(
    ("answer", "up", "detail"),
    [
        (httpx2.Response(200, json={"status": "ok"}), True, "up"),
        (httpx2.Response(503), False, "/healthz answered 503"),
        (httpx2.ConnectError("refused"), False, "not running"),
        (httpx2.ReadTimeout("slow"), False, "no answer within"),
    ],
)
def test_server_status_probe(answer, up, detail):
    seen = []

    def get(url, timeout):
        seen.append(url)
        if isinstance(answer, Exception):
            raise answer
        return answer

    st = server_status("http://127.0.0.1:8123/v1", get=get)
    assert seen == ["http://127.0.0.1:8123/healthz"]
    assert st.url == "http://127.0.0.1:8123/v1" and st.up is up and detail in st.detail
