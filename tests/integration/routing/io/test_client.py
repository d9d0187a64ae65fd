"""Issue 7, defect by defect: the router as it is today against the scripted chaos upstream.

Each test states the behaviour the issue asks for. Where today's router does not have it yet, the test
is marked ``xfail(strict=True)`` with the defect's number, so a fix shows up as an XPASS that fails
the run: remove the marker in the same change. Tests without the marker guard behaviour that is
already right and must stay so (e.g. request-level 400s do not fail over).

The router is built through the public ``RoutingClient.from_config`` from a TOML file whose primary
(``chaos``) is the loopback chaos upstream and whose fallback (``direct``) is the built-in simulator;
all construction lives in :func:`make_router`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.config import ConfigError
from app.routing import AllRoutesFailed, ClientClosedError, GatewayError, RoutingClient, StreamBrokenError
from core.errors import InvalidRequest
from core.session import session_header_value
from tests.support import paths
from tests.support.chaos_upstream import (
    ChaosUpstream,
    Fault,
    _stream_events,
    bad_json,
    context_length,
    empty_choices,
    error,
    hang,
    html_200,
    invalid_parameter,
    json_array_200,
    litellm_invalid_model,
    litellm_no_db,
    null_choices,
    ok,
    rate_limited,
    redirect,
    server_error,
    stream_null_choices,
    trickle,
    unauthorized_echo,
    unavailable,
)

REPO = paths.REPO
KEY = "sk-chaos-defects-0123456789abcdef"
KEY_ENV = "CHAOS_UPSTREAM_KEY"
HI = [{"role": "user", "content": "hi"}]
OK_TEXT = "chaos says hello"


def make_router(
    path: Path,
    database_url: str,
    upstream: ChaosUpstream,
    *,
    sections: Mapping[str, str] | None = None,
    base_url: str | None = None,
    **kwargs,
) -> RoutingClient:
    """The one place a router is built: primary ``chaos`` = the chaos upstream (all traffic, ratio 1),
    fallback ``direct`` = the instant simulator, no backoff waits. ``sections`` adds lines to a TOML
    table (``{"retry": "max_attempts = 1"}``; for ``simulator`` they replace ``latency_scale = 0``);
    ``kwargs`` go to the constructor (``sleep``, ...)."""
    extra = dict(sections or {})
    url = base_url if base_url is not None else upstream.base_url("chaos")
    toml = f"""
[routing]
primary = "chaos"
fallback = "direct"
initial_ratio = 1.0
{extra.pop("routing", "")}
[retry]
base_delay_s = 0
{extra.pop("retry", "")}
[providers.chaos]
base_url = "{url}"
api_key_env = "{KEY_ENV}"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"
{extra.pop("providers.chaos", "")}
[providers.direct]
base_url = "sim://direct"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"
[simulator]
seed = 1
{extra.pop("simulator", "latency_scale = 0")}
[telemetry]
{extra.pop("telemetry", "")}
[breaker]
{extra.pop("breaker", "")}
"""
    assert not extra, f"unknown sections {sorted(extra)}"
    path.write_text(toml)
    os.environ["DATABASE_URL"] = database_url  # restored by the fixture's monkeypatch
    os.environ[KEY_ENV] = KEY
    kwargs.setdefault("sleep", lambda _s: None)
    return RoutingClient.from_config(str(path), **kwargs)


@pytest.fixture
def up() -> Iterator[ChaosUpstream]:
    with ChaosUpstream() as server:
        yield server


@pytest.fixture
def router(tmp_path, up, monkeypatch):
    """``router(**options)`` builds through :func:`make_router` on a fresh SQLite file; closed after."""
    monkeypatch.setenv("DATABASE_URL", "")
    monkeypatch.setenv(KEY_ENV, KEY)
    made: list[RoutingClient] = []

    def build(database_url: str | None = None, **options) -> RoutingClient:
        url = database_url or f"sqlite:///{tmp_path / 'gateway.db'}"
        client = make_router(tmp_path / f"gateway-{len(made)}.toml", url, up, **options)
        made.append(client)
        return client

    yield build
    for client in made:
        client.close()


def flushed(client: RoutingClient, within_s: float = 3.0) -> bool:
    """Whether the log drained within a bound (a stuck writer must fail the test, not hang it)."""
    t = threading.Thread(target=client.flush, daemon=True)
    t.start()
    t.join(within_s)
    return not t.is_alive()


def log_rows(client: RoutingClient) -> list[dict]:
    with client.engine.connect() as conn:
        q = text("select * from request_log order by request_id, attempt")
        return [dict(r) for r in conn.execute(q).mappings()]


def chaos_requests(up: ChaosUpstream) -> int:
    return len(up.requests_for("chaos"))


# -- 1. one upstream error text stops the request log ------------------------------------------------
def test_1_lone_surrogate_in_an_upstream_error_is_logged(router, up):
    up.script(unavailable("bad \udcff thing"), provider="chaos")
    client = router()
    r = client.chat(HI)
    assert r.text == OK_TEXT and r.attempts == 2
    assert flushed(client)
    rows = log_rows(client)
    assert [row["status"] for row in rows] == ["error", "ok"]
    assert "bad" in rows[0]["error_message"] and rows[0]["error_message"].encode("utf-8")


def test_1_lone_surrogate_in_a_prompt_is_sent_and_stored(router, up):
    client = router(sections={"telemetry": "store_prompts = true"})
    r = client.chat([{"role": "user", "content": "bad \udcff prompt"}])
    assert r.provider == "chaos" and r.attempts == 1
    assert up.requests_for("chaos")[0].json["messages"][0]["content"].encode("utf-8")
    assert flushed(client)
    assert log_rows(client)[0]["prompt_text"].encode("utf-8")


@pytest.mark.postgres
def test_1_nul_in_an_upstream_error_is_logged_on_postgresql(router, up, pg_url):
    up.script(unavailable("bad \u0000 thing"), provider="chaos")
    client = router(pg_url)
    assert client.chat(HI).attempts == 2
    assert flushed(client)
    rows = log_rows(client)
    assert [row["status"] for row in rows] == ["error", "ok"] and "\x00" not in rows[0]["error_message"]


# -- 2. malformed 200s -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(html_200(), id="text-html"),
        pytest.param(json_array_200(), id="json-array"),
        pytest.param(bad_json(), id="bad-json"),  # already a retryable bad_response today
    ],
)
def test_2_malformed_200_is_an_upstream_failure_that_is_retried(router, up, fault):
    up.script(fault, provider="chaos")
    client = router()
    r = client.chat(HI)
    assert r.text == OK_TEXT and r.attempts == 2
    assert r.attempt_log[0].status == "error" and r.attempt_log[0].error_class is not None
    assert flushed(client)
    assert [row["status"] for row in log_rows(client)] == ["error", "ok"]


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(empty_choices(), id="empty"),
        pytest.param(null_choices(), id="null"),
    ],
)
def test_2_no_choices_is_not_a_successful_answer(router, up, fault):
    up.script(fault, provider="chaos")
    r = router().chat(HI)
    assert r.text == OK_TEXT and r.attempts == 2 and r.attempt_log[0].status == "error"


def test_2_stream_chunk_with_null_choices_is_retried(router, up):
    up.script(stream_null_choices(), provider="chaos")
    stream = router().chat(HI, stream=True)
    assert "".join(stream) == OK_TEXT
    assert stream.result.attempts == 2 and stream.result.attempt_log[0].status == "error"


def test_2_our_own_errors_are_not_classified_as_upstream_faults():
    from app.routing.io.classify import classify

    with pytest.raises(ValueError, match="our own bug"):
        classify(ValueError("our own bug"), sent_hints=False)


# -- 3. session ids outside ASCII --------------------------------------------------------------------
@pytest.mark.parametrize("session_id", ["세션", "café", "\U0001f680", "\n"])
def test_3_any_unicode_session_id_reaches_the_primary_as_an_ascii_header(router, up, session_id):
    r = router().chat(HI, session_id=session_id)
    assert r.provider == "chaos" and r.attempts == 1 and r.session_id == session_id
    header = up.requests_for("chaos")[0].headers["x-session-id"]
    assert header and header.isascii() and header.isprintable()


# -- 4. the request path waits on the database -------------------------------------------------------
@pytest.mark.postgres
def test_4_chat_is_served_while_the_canary_table_is_locked(router, up, pg_url):
    client = router(pg_url)
    client.chat(HI)  # warm: clients built, ratio read once
    client.refresh()  # today this makes the next chat() read the ratio again
    locker = create_engine(pg_url)
    outcome: list[object] = []
    t = threading.Thread(target=lambda: outcome.append(client.chat(HI)), daemon=True)
    with locker.connect() as conn:
        conn.execute(text("lock table canary_setting in access exclusive mode"))
        t.start()
        t.join(3.0)  # a bound on the wait, not a timing assertion: unblocked the answer takes ms
        served = not t.is_alive()
        conn.rollback()
    t.join()
    locker.dispose()
    assert served and outcome and outcome[0].provider == "chaos"


# -- 5. duplicate rows -------------------------------------------------------------------------------
def test_5_a_failing_guardrail_check_does_not_duplicate_rows(router, up):
    client = router()
    with client.engine.begin() as conn:  # the guardrail's read now fails after the insert has committed
        conn.execute(text("drop table guardrail_setting"))
    results = [client.chat(HI) for _ in range(5)]
    assert flushed(client)
    rows = log_rows(client)
    assert len(rows) == sum(r.attempts for r in results) == 5
    assert len({(row["request_id"], row["attempt"]) for row in rows}) == len(rows)


# -- 6. the attempt timeout is per read --------------------------------------------------------------
def test_6_attempt_timeout_is_a_deadline_over_the_whole_answer(router, up):
    up.set_default(trickle(0.02), provider="chaos")  # ~300 bytes: about 6 s at one byte per 20 ms
    client = router(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})
    outcome: list[object] = []
    t = threading.Thread(target=lambda: outcome.append(client.chat(HI)), daemon=True)
    t.start()
    t.join(2.0)  # bound on the wait: with a 0.2 s deadline the fallback answers well inside it
    ended = not t.is_alive()
    up.stop()  # releases the trickle so the thread ends either way
    t.join()
    assert ended and outcome[0].provider == "direct" and outcome[0].attempt_log[0].error_class == "timeout"


def test_6_a_trickling_stream_is_bounded_too(router, up):
    up.set_default(trickle(0.02), provider="chaos")  # first content after ~150 bytes, ~3 s
    client = router(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})
    outcome: list[tuple[str, object]] = []

    def run() -> None:
        stream = client.chat(HI, stream=True)
        outcome.append(("".join(stream), stream.result))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(2.0)  # bound on the wait, as above
    ended = not t.is_alive()
    up.stop()
    t.join()
    text, result = outcome[0]
    assert ended and text and result.provider == "direct" and result.fallback_used


# -- 7. a 3xx disables fallback ----------------------------------------------------------------------
def test_7_redirect_is_not_followed_and_fails_over(router, up):
    up.set_default(redirect(up.base_url("elsewhere") + "/chat/completions"), provider="chaos")
    r = router().chat(HI)
    assert r.provider == "direct" and r.fallback_used
    assert up.requests_for("elsewhere") == []  # the key never went to the Location


# -- 8. gateways behind gateways ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(litellm_invalid_model(), id="invalid-model"),
        pytest.param(litellm_no_db(), id="no-db"),
    ],
)
def test_8_route_level_400_fails_over(router, up, fault):
    up.set_default(fault, provider="chaos")
    r = router().chat(HI)
    assert r.provider == "direct" and r.fallback_used and chaos_requests(up) == 1


@pytest.mark.parametrize("fault", [context_length(), invalid_parameter()], ids=["context-length", "invalid-param"])
def test_8_request_level_400_does_not_fail_over(router, up, fault):
    from app.routing.result import AllRoutesFailed

    up.set_default(fault, provider="chaos")
    with pytest.raises(AllRoutesFailed) as e:
        router().chat(HI)
    assert [a.provider for a in e.value.attempts] == ["chaos"] and e.value.attempts[0].http_status == 400


def test_8_stream_time_to_first_token_counts_from_the_callers_request(router, up):
    up.set_default(server_error(), provider="chaos")
    stream = router().chat(HI, stream=True)
    assert "".join(stream)
    result = stream.result
    waited_before = sum(a.latency_ms for a in result.attempt_log[:-1])
    assert result.fallback_used and result.ttft_ms >= waited_before


# -- 9. no circuit breaker ---------------------------------------------------------------------------
def test_9_an_outage_opens_the_breaker(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router()
    results = [client.chat(HI) for _ in range(20)]
    assert all(r.provider == "direct" for r in results)
    per_request = client.settings.retry.max_attempts
    assert chaos_requests(up) < 20 * per_request  # later requests skip the open primary
    assert results[-1].attempt_log[0].provider == "direct"


def test_9_retry_after_beyond_the_cap_fails_over_at_once(router, up):
    up.set_default(rate_limited(retry_after_s=3600), provider="chaos")
    sleeps: list[float] = []
    r = router(sleep=sleeps.append).chat(HI)
    assert r.provider == "direct" and chaos_requests(up) == 1 and sleeps == []


# -- 10. chat after close ----------------------------------------------------------------------------
def test_10_chat_after_close_raises_without_touching_the_network(router, up):
    client = router()
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.chat(HI)
    assert chaos_requests(up) == 0


# -- 11. secrets and hygiene -------------------------------------------------------------------------
def test_11_an_echoed_key_is_neither_stored_nor_shown(router, up):
    up.script(unauthorized_echo(), provider="chaos")
    client = router()
    r = client.chat(HI)
    assert r.provider == "direct"
    assert KEY not in (r.attempt_log[0].error or "") and KEY not in repr(r.to_dict())
    assert flushed(client)
    assert all(KEY not in (row["error_message"] or "") for row in log_rows(client))


def test_11_csv_export_neutralises_formulas_from_upstream_text(router, up):
    from app.monitor import recent_requests, requests_csv
    from app.routing.result import AllRoutesFailed

    up.script(error(400, '=HYPERLINK("http://evil.example","click")', name="formula"), provider="chaos")
    client = router()
    with pytest.raises(AllRoutesFailed):
        client.chat(HI)
    assert flushed(client)
    csv_text = requests_csv(recent_requests(client.engine))
    assert "=HYPERLINK" in csv_text  # the row is there...
    assert ",=HYPERLINK" not in csv_text and ',"=HYPERLINK' not in csv_text  # ...but not as a formula


# -- 12. accepted values that cannot work ------------------------------------------------------------
@pytest.mark.parametrize(
    ("sections", "base_url", "field"),
    [
        ({"telemetry": "flush_interval_s = inf"}, None, "flush_interval_s"),
        ({"simulator": "latency_scale = 1e300"}, None, "latency_scale"),
        ({"retry": "max_total_wait_s = inf"}, None, "max_total_wait_s"),
        ({}, "http://", "base_url"),
    ],
    ids=["flush-interval-inf", "latency-scale-1e300", "max-total-wait-inf", "empty-host"],
)
def test_12_settings_that_cannot_work_are_refused(router, sections, base_url, field):
    with pytest.raises(ConfigError, match=field):
        router(sections=sections, base_url=base_url)


@pytest.mark.parametrize(
    ("args", "field"),
    [(["canary", "set", "1e-400", "--reason", "chaos"], "ratio"), (["prune", "--days", "nan"], "days")],
    ids=["canary-1e-400", "prune-days-nan"],
)
def test_12_cli_refuses_numbers_that_cannot_work(tmp_path, args, field):
    config = tmp_path / "gateway.toml"
    config.write_text((REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}", GATEWAY_CONFIG=str(config))
    proc = subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert field in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"], ids=["sqlite-empty", "sqlite-memory"])
def test_12_in_memory_database_urls_are_refused(router, url):
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        router(url)


# -- routing hostile -------------------------------------------------------------------------------
# The routing client against hostile upstreams, beyond the one-test-per-defect file: hangs bounded by
# deadlines, the request deadline across attempts, per-provider attempt counts, the circuit breaker's
# states and hooks, our own bugs surfacing, session ids, and chat() during close.
#
# Built like tests/integration/routing/io/test_client.py (``make_router``): primary ``chaos`` is the loopback
# chaos upstream, fallback ``direct`` is the instant simulator.


@pytest.fixture
def router_routing_hostile(tmp_path, up, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "")
    monkeypatch.setenv(KEY_ENV, KEY)
    made: list[RoutingClient] = []

    def build(**options) -> RoutingClient:
        url = f"sqlite:///{tmp_path / 'gateway.db'}"
        client = make_router(tmp_path / f"gateway-{len(made)}.toml", url, up, **options)
        made.append(client)
        return client

    yield build
    for client in made:
        client.close()


def in_thread(fn, bound_s: float, up: ChaosUpstream) -> tuple[bool, list[object]]:
    """Run ``fn`` in a thread; whether it ended within ``bound_s`` (a bound on the wait, not a timing
    assertion), then release the upstream so the thread ends either way."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound_s)
    ended = not t.is_alive()
    up.stop()
    t.join()
    return ended, outcome


# -- deadlines ---------------------------------------------------------------------------------------
def test_a_hanging_upstream_is_cut_at_the_attempt_deadline_and_fails_over(router_routing_hostile, up):
    up.set_default(hang(), provider="chaos")
    client = router_routing_hostile(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})
    ended, outcome = in_thread(lambda: client.chat(HI), 3.0, up)
    assert ended and outcome[0].provider == "direct"
    assert outcome[0].attempt_log[0].error_class == "timeout"


def test_a_hanging_stream_is_cut_at_the_first_token_deadline(router_routing_hostile, up):
    up.set_default(hang(), provider="chaos")
    client = router_routing_hostile(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})

    def run():
        stream = client.chat(HI, stream=True)
        return "".join(stream), stream.result

    ended, outcome = in_thread(run, 3.0, up)
    text, result = outcome[0]
    assert ended and text and result.provider == "direct"
    assert result.attempt_log[0].error_class == "timeout"
    # time to first token counts from the caller's request; the attempt's own figure is kept beside it
    last = result.attempt_log[-1]
    assert result.ttft_ms == last.ttft_ms and last.attempt_ttft_ms <= last.ttft_ms


def first_token_then_stall() -> Fault:
    """A stream that sends its first words, then nothing until the server stops."""

    def serve(h, req) -> None:
        h.start_chunked(200, "text/event-stream")
        for event in _stream_events(req.model, "first words then silence", 5)[:2]:
            h.write_chunk(event)
        h.server.stopping.wait()
        h.abort(reset=False)

    return Fault("first_token_then_stall", serve)


def test_a_stream_that_stalls_after_its_first_token_is_cut_at_the_idle_gap(router_routing_hostile, up):
    up.set_default(first_token_then_stall(), provider="chaos")
    client = router_routing_hostile(sections={"retry": "stream_idle_timeout_s = 0.2"})
    got: list[str] = []

    def run():
        for piece in client.chat(HI, stream=True):
            got.append(piece)

    ended, outcome = in_thread(run, 3.0, up)
    assert ended and isinstance(outcome[0], StreamBrokenError) and got == ["first"]
    assert flushed(client)
    assert [r["error_class"] for r in log_rows(client)] == ["stream_broken"]


def test_the_request_deadline_bounds_all_attempts_together(router_routing_hostile, up):
    up.set_default(hang(), provider="chaos")
    client = router_routing_hostile(sections={"providers.chaos": "timeout_s = 30", "retry": "request_deadline_s = 0.3"})
    ended, outcome = in_thread(lambda: client.chat(HI), 3.0, up)
    assert ended and isinstance(outcome[0], AllRoutesFailed)
    assert "deadline" in str(outcome[0]) and [a.provider for a in outcome[0].attempts] == ["chaos"]


# -- per-provider attempts and Retry-After -----------------------------------------------------------
def test_a_provider_with_max_attempts_1_is_tried_once_before_the_fallback(router_routing_hostile, up):
    up.set_default(unavailable(), provider="chaos")
    sleeps: list[float] = []
    r = router_routing_hostile(sections={"providers.chaos": "max_attempts = 1"}, sleep=sleeps.append).chat(HI)
    assert r.provider == "direct" and chaos_requests(up) == 1 and sleeps == []


def test_retry_after_within_the_cap_is_waited_then_retried(router_routing_hostile, up):
    up.script(rate_limited(retry_after_s=2), provider="chaos")
    sleeps: list[float] = []
    r = router_routing_hostile(sleep=sleeps.append).chat(HI)
    assert r.provider == "chaos" and r.text == OK_TEXT and chaos_requests(up) == 2 and sleeps[0] >= 2


# -- circuit breaker ---------------------------------------------------------------------------------
def test_breaker_opens_skips_then_probes_and_closes(router_routing_hostile, up):
    now = [1000.0]
    changes: list[tuple[str, str, str]] = []
    up.set_default(server_error(), provider="chaos")
    client = router_routing_hostile(
        sections={"breaker": "min_attempts = 2\nfailure_rate = 1.0\ncooldown_s = 5", "retry": "max_attempts = 1"},
        clock=lambda: now[0],
    )
    client.on_breaker_change.append(lambda name, old, new, why: changes.append((name, old, new)))
    assert client.breaker_states()["chaos"].state == "closed"
    for _ in range(2):
        assert client.chat(HI).provider == "direct"
    assert client.breaker_states()["chaos"].state == "open"
    assert changes == [("chaos", "closed", "open")]
    r = client.chat(HI)  # skipped at once: no attempt on the open primary
    assert r.provider == "direct" and [a.provider for a in r.attempt_log] == ["direct"] and chaos_requests(up) == 2

    up.set_default(ok(), provider="chaos")
    now[0] += 6  # cooldown over: one probe goes through, succeeds, and closes the breaker
    assert client.chat(HI).provider == "chaos"
    assert client.breaker_states()["chaos"].state == "closed"
    assert changes[1:] == [("chaos", "open", "half_open"), ("chaos", "half_open", "closed")]


def test_request_errors_do_not_count_against_the_breaker(router_routing_hostile, up):
    from tests.support.chaos_upstream import context_length

    up.set_default(context_length(), provider="chaos")
    client = router_routing_hostile(sections={"breaker": "min_attempts = 1"})
    for _ in range(3):
        with pytest.raises(AllRoutesFailed):
            client.chat(HI)
    snap = client.breaker_states()["chaos"]
    assert snap.state == "closed" and snap.attempts == 0


def test_a_failing_breaker_hook_does_not_break_routing(router_routing_hostile, up):
    up.set_default(server_error(), provider="chaos")
    client = router_routing_hostile(sections={"breaker": "min_attempts = 1"})

    def broken_hook(*_args):
        raise RuntimeError("listener bug")

    client.on_breaker_change.append(broken_hook)
    assert client.chat(HI).provider == "direct"
    assert client.breaker_states()["chaos"].state == "open"


# -- our own bugs ------------------------------------------------------------------------------------
def test_our_own_bug_surfaces_and_is_logged_as_internal_error(router_routing_hostile, up, monkeypatch):
    import app.routing.answers as core_module

    def buggy(body):
        raise TypeError("our own bug")

    monkeypatch.setitem(core_module._READERS, "chat", buggy)
    client = router_routing_hostile()
    with pytest.raises(TypeError, match="our own bug"):
        client.chat(HI)
    assert chaos_requests(up) == 1  # not retried against an innocent upstream
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["error_class"], r["final"]) for r in rows] == [("internal_error", True)]


# -- text hygiene ------------------------------------------------------------------------------------
def test_failure_texts_are_cleaned_before_they_are_shown(router_routing_hostile, up):
    up.set_default(server_error(f"backend said \x00 {KEY} \udcff"), provider="chaos")
    client = router_routing_hostile(sections={"routing": "fallback_enabled = false"})
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(HI)
    shown = str(info.value)
    assert KEY not in shown and "\x00" not in shown and "[REDACTED]" in shown
    shown.encode("utf-8")  # no lone surrogate left


# -- session ids -------------------------------------------------------------------------------------
@pytest.mark.parametrize("session_id", ["세션", "user 1", "u-plain"])
def test_session_header_is_the_stable_ascii_encoding(router_routing_hostile, up, session_id):
    router_routing_hostile().chat(HI, session_id=session_id)
    assert up.requests_for("chaos")[0].headers["x-session-id"] == session_header_value(session_id)


@pytest.mark.parametrize("session_id", ["", "x" * 129, "a\x00b", "bad \udcff"])
def test_unusable_session_ids_are_refused_before_any_network_call(router_routing_hostile, up, session_id):
    with pytest.raises(InvalidRequest, match="session_id"):
        router_routing_hostile().chat(HI, session_id=session_id)
    assert chaos_requests(up) == 0


# -- close -------------------------------------------------------------------------------------------
def test_chat_after_close_is_a_gateway_error(router_routing_hostile, up):
    client = router_routing_hostile()
    client.chat(HI)
    client.close()
    with pytest.raises(ClientClosedError, match="closed") as info:
        client.chat(HI, stream=True)
    assert isinstance(info.value, GatewayError) and chaos_requests(up) == 1
