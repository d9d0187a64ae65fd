"""The routing client against hostile upstreams, beyond the one-test-per-defect file: hangs bounded by
deadlines, the request deadline across attempts, per-provider attempt counts, the circuit breaker's
states and hooks, our own bugs surfacing, session ids, and chat() during close.

Built like tests/unit/test_incident_defects.py (``make_router``): primary ``chaos`` is the loopback
chaos upstream, fallback ``direct`` is the instant simulator.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from app.routing import AllRoutesFailed, ClientClosedError, GatewayError, RoutingClient, StreamBrokenError
from core.errors import InvalidRequest
from core.session import session_header_value
from tests.support.chaos_upstream import (
    ChaosUpstream,
    Fault,
    _stream_events,
    hang,
    ok,
    rate_limited,
    server_error,
    unavailable,
)
from tests.unit.test_incident_defects import HI, KEY, KEY_ENV, OK_TEXT, chaos_requests, flushed, log_rows, make_router


@pytest.fixture
def up() -> Iterator[ChaosUpstream]:
    with ChaosUpstream() as server:
        yield server


@pytest.fixture
def router(tmp_path, up, monkeypatch):
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
def test_a_hanging_upstream_is_cut_at_the_attempt_deadline_and_fails_over(router, up):
    up.set_default(hang(), provider="chaos")
    client = router(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})
    ended, outcome = in_thread(lambda: client.chat(HI), 3.0, up)
    assert ended and outcome[0].provider == "direct"
    assert outcome[0].attempt_log[0].error_class == "timeout"


def test_a_hanging_stream_is_cut_at_the_first_token_deadline(router, up):
    up.set_default(hang(), provider="chaos")
    client = router(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})

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


def test_a_stream_that_stalls_after_its_first_token_is_cut_at_the_idle_gap(router, up):
    up.set_default(first_token_then_stall(), provider="chaos")
    client = router(sections={"retry": "stream_idle_timeout_s = 0.2"})
    got: list[str] = []

    def run():
        for piece in client.chat(HI, stream=True):
            got.append(piece)

    ended, outcome = in_thread(run, 3.0, up)
    assert ended and isinstance(outcome[0], StreamBrokenError) and got == ["first"]
    assert flushed(client)
    assert [r["error_class"] for r in log_rows(client)] == ["stream_broken"]


def test_the_request_deadline_bounds_all_attempts_together(router, up):
    up.set_default(hang(), provider="chaos")
    client = router(sections={"providers.chaos": "timeout_s = 30", "retry": "request_deadline_s = 0.3"})
    ended, outcome = in_thread(lambda: client.chat(HI), 3.0, up)
    assert ended and isinstance(outcome[0], AllRoutesFailed)
    assert "deadline" in str(outcome[0]) and [a.provider for a in outcome[0].attempts] == ["chaos"]


# -- per-provider attempts and Retry-After -----------------------------------------------------------
def test_a_provider_with_max_attempts_1_is_tried_once_before_the_fallback(router, up):
    up.set_default(unavailable(), provider="chaos")
    sleeps: list[float] = []
    r = router(sections={"providers.chaos": "max_attempts = 1"}, sleep=sleeps.append).chat(HI)
    assert r.provider == "direct" and chaos_requests(up) == 1 and sleeps == []


def test_retry_after_within_the_cap_is_waited_then_retried(router, up):
    up.script(rate_limited(retry_after_s=2), provider="chaos")
    sleeps: list[float] = []
    r = router(sleep=sleeps.append).chat(HI)
    assert r.provider == "chaos" and r.text == OK_TEXT and chaos_requests(up) == 2 and sleeps[0] >= 2


# -- circuit breaker ---------------------------------------------------------------------------------
def test_breaker_opens_skips_then_probes_and_closes(router, up):
    now = [1000.0]
    changes: list[tuple[str, str, str]] = []
    up.set_default(server_error(), provider="chaos")
    client = router(
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


def test_request_errors_do_not_count_against_the_breaker(router, up):
    from tests.support.chaos_upstream import context_length

    up.set_default(context_length(), provider="chaos")
    client = router(sections={"breaker": "min_attempts = 1"})
    for _ in range(3):
        with pytest.raises(AllRoutesFailed):
            client.chat(HI)
    snap = client.breaker_states()["chaos"]
    assert snap.state == "closed" and snap.attempts == 0


def test_a_failing_breaker_hook_does_not_break_routing(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router(sections={"breaker": "min_attempts = 1"})

    def broken_hook(*_args):
        raise RuntimeError("listener bug")

    client.on_breaker_change.append(broken_hook)
    assert client.chat(HI).provider == "direct"
    assert client.breaker_states()["chaos"].state == "open"


# -- our own bugs ------------------------------------------------------------------------------------
def test_our_own_bug_surfaces_and_is_logged_as_internal_error(router, up, monkeypatch):
    import app.routing.answers as core_module

    def buggy(body):
        raise TypeError("our own bug")

    monkeypatch.setitem(core_module._READERS, "chat", buggy)
    client = router()
    with pytest.raises(TypeError, match="our own bug"):
        client.chat(HI)
    assert chaos_requests(up) == 1  # not retried against an innocent upstream
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["error_class"], r["final"]) for r in rows] == [("internal_error", True)]


# -- text hygiene ------------------------------------------------------------------------------------
def test_failure_texts_are_cleaned_before_they_are_shown(router, up):
    up.set_default(server_error(f"backend said \x00 {KEY} \udcff"), provider="chaos")
    client = router(sections={"routing": "fallback_enabled = false"})
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(HI)
    shown = str(info.value)
    assert KEY not in shown and "\x00" not in shown and "[REDACTED]" in shown
    shown.encode("utf-8")  # no lone surrogate left


# -- session ids -------------------------------------------------------------------------------------
@pytest.mark.parametrize("session_id", ["세션", "user 1", "u-plain"])
def test_session_header_is_the_stable_ascii_encoding(router, up, session_id):
    router().chat(HI, session_id=session_id)
    assert up.requests_for("chaos")[0].headers["x-session-id"] == session_header_value(session_id)


@pytest.mark.parametrize("session_id", ["", "x" * 129, "a\x00b", "bad \udcff"])
def test_unusable_session_ids_are_refused_before_any_network_call(router, up, session_id):
    with pytest.raises(InvalidRequest, match="session_id"):
        router().chat(HI, session_id=session_id)
    assert chaos_requests(up) == 0


# -- close -------------------------------------------------------------------------------------------
def test_chat_after_close_is_a_gateway_error(router, up):
    client = router()
    client.chat(HI)
    client.close()
    with pytest.raises(ClientClosedError, match="closed") as info:
        client.chat(HI, stream=True)
    assert isinstance(info.value, GatewayError) and chaos_requests(up) == 1
