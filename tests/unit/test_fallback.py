"""The retry and fallback matrix of the RoutingClient, through the real openai SDK.

The primary is a scripted MockTransport; the fallback is the built-in simulator. The canary ratio is
set to 1.0 so every request is assigned to the primary first.
"""

from __future__ import annotations

import json
import threading

import httpx2
import pytest

from app.routing import AllRoutesFailed, StreamBrokenError
from db.canary import set_ratio
from tests.configs import two_providers


def completion(model: str = "gemini-2.5-flash", text: str = "primary answer", cached: int = 0) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def sse(chunks: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if usage else [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]
    c = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gemini-2.5-flash", "choices": choices}
    if usage:
        c["usage"] = usage
    return c


class Script:
    """A primary upstream whose answers are a list of callables or responses, one per call."""

    def __init__(self, *steps):
        self.steps = list(steps)
        self.requests: list[httpx2.Request] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        with self.lock:
            self.requests.append(request)
            step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return step(request) if callable(step) else step


def status(code: int, message: str = "upstream says no", headers: dict | None = None) -> httpx2.Response:
    return httpx2.Response(code, json={"error": {"message": message, "type": "test"}}, headers=headers or {})


@pytest.fixture
def routed(client_factory, sqlite_url):
    """A client whose primary is the given script; ratio 1.0 so requests start on the primary."""
    sleeps: list[float] = []

    def make(script: Script, **kwargs):
        client = client_factory(
            sqlite_url, transports={"holysheep": httpx2.MockTransport(script)}, sleep=sleeps.append, **kwargs
        )
        set_ratio(client.engine, 1.0, expected_version=None, actor="test", reason="all to primary")
        client.refresh()
        return client

    make.sleeps = sleeps
    return make


MSG = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize("code", [408, 409, 429, 500, 502, 503, 504])
def test_retryable_status_is_retried_then_falls_back(routed, code):
    script = Script(status(code))
    client = routed(script)
    r = client.chat(MSG, session_id="s")
    assert r.provider == "direct" and r.fallback_used
    max_attempts = client.settings.retry.max_attempts
    assert len(script.requests) == max_attempts
    assert r.attempts == max_attempts + 1
    assert [a.http_status for a in r.attempt_log[:-1]] == [code] * max_attempts
    assert len(routed.sleeps) == max_attempts - 1


@pytest.mark.parametrize("code", [408, 429, 500, 503])
def test_retryable_status_recovers_on_primary(routed, code):
    script = Script(status(code), httpx2.Response(200, json=completion()))
    r = routed(script).chat(MSG)
    assert r.provider == "holysheep" and not r.fallback_used
    assert r.attempts == 2 and r.text == "primary answer"


@pytest.mark.parametrize("code", [401, 403, 404])
def test_auth_and_not_found_fall_back_without_retry(routed, code):
    script = Script(status(code))
    r = routed(script).chat(MSG)
    assert len(script.requests) == 1
    assert r.provider == "direct" and r.fallback_used and r.attempts == 2
    assert routed.sleeps == []


@pytest.mark.parametrize("code", [400, 413, 422])
def test_request_errors_do_not_fall_back(routed, code):
    script = Script(status(code, "bad request body"))
    client = routed(script)
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(MSG)
    assert len(script.requests) == 1
    assert len(info.value.attempts) == 1
    assert "holysheep" in str(info.value) and str(code) in str(info.value)
    assert "refused" in str(info.value)


@pytest.mark.parametrize(
    "exc",
    [
        httpx2.ReadTimeout("slow"),
        httpx2.ConnectError("refused"),
        httpx2.RemoteProtocolError("connection reset by peer"),
    ],
)
def test_transport_failures_retry_then_fall_back(routed, exc):
    def boom(request):
        raise type(exc)(str(exc), request=request)

    script = Script(boom)
    client = routed(script)
    r = client.chat(MSG)
    assert r.provider == "direct" and r.fallback_used
    assert len(script.requests) == client.settings.retry.max_attempts
    expected = "timeout" if isinstance(exc, httpx2.TimeoutException) else "connection"
    assert {a.error_class for a in r.attempt_log[:-1]} == {expected}


def test_malformed_json_is_retried_then_falls_back(routed):
    script = Script(httpx2.Response(200, content=b"{not json", headers={"content-type": "application/json"}))
    client = routed(script)
    r = client.chat(MSG)
    assert r.provider == "direct"
    assert r.attempt_log[0].error_class == "bad_response"


def test_cache_hint_rejection_resends_without_hints(routed):
    def picky(request):
        if "x-session-id" in request.headers:
            return status(400, "unsupported header: x-session-id (cache hints)")
        return httpx2.Response(200, json=completion(cached=4))

    script = Script(picky)
    r = routed(script).chat(MSG, session_id="sess-1")
    assert r.provider == "holysheep" and not r.fallback_used
    assert r.attempts == 2
    assert script.requests[0].headers["x-session-id"] == "sess-1"
    assert "x-session-id" not in script.requests[1].headers
    assert [a.with_hints for a in r.attempt_log] == [True, False]
    assert r.usage.cached_tokens == 4


def test_plain_400_with_hints_is_not_mistaken_for_hint_rejection(routed):
    script = Script(status(400, "messages[0].content is too long"))
    with pytest.raises(AllRoutesFailed):
        routed(script).chat(MSG, session_id="sess-1")
    assert len(script.requests) == 1


def test_session_id_header_and_cached_tokens_read_back(routed):
    script = Script(httpx2.Response(200, json=completion(cached=7)))
    r = routed(script).chat(MSG, session_id="abc")
    assert script.requests[0].headers["x-session-id"] == "abc"
    assert r.usage.cached_tokens == 7 and r.usage.prompt_tokens == 10


def test_all_routes_failed_names_each_attempt(routed, sqlite_url):
    from core.faults import FaultSettings
    from db.engine import get_engine
    from db.faults import set_faults

    # The fallback simulator fails every request too (fault row written before the client exists).
    set_faults(get_engine(sqlite_url), "direct", FaultSettings(error_rate=1.0), actor="test")
    client = routed(Script(status(503, "primary overloaded")))
    with pytest.raises(AllRoutesFailed) as info:
        client.chat(MSG)
    err = info.value
    n = client.settings.retry.max_attempts
    assert len(err.attempts) == 2 * n
    text = str(err)
    assert text.count("holysheep/") == n and text.count("direct/") == n
    assert "primary overloaded" in text and "server_error 500" in text


def test_retry_after_is_honoured_and_capped(routed):
    script = Script(
        status(429, headers={"retry-after": "3"}),
        status(429, headers={"retry-after-ms": "1500"}),
        status(429, headers={"retry-after": "999"}),
        httpx2.Response(200, json=completion()),
    )
    client = routed(script)
    client.chat(MSG)
    assert routed.sleeps[0] >= 3.0
    assert routed.sleeps[1] >= 1.5
    # The third 429 would be the 4th attempt; with max_attempts=3 it falls back instead.
    assert len(routed.sleeps) == 2
    assert all(s <= client.settings.retry.retry_after_cap_s for s in routed.sleeps)


def test_missing_key_falls_back_with_clear_message(client_factory, sqlite_url):
    toml = two_providers(primary="real").replace("HOLYSHEEP_API_KEY", "NO_SUCH_KEY_FOR_TEST")
    client = client_factory(sqlite_url, toml=toml, env={})
    set_ratio(client.engine, 1.0, expected_version=None, actor="t", reason="r")
    client.refresh()
    r = client.chat(MSG)
    assert r.provider == "direct" and r.fallback_used
    assert "not configured: set NO_SUCH_KEY_FOR_TEST" in r.attempt_log[0].error


# -- streaming ---------------------------------------------------------------------------------
def stream_response(chunks: list[dict]) -> httpx2.Response:
    return httpx2.Response(200, content=sse(chunks), headers={"content-type": "text/event-stream"})


def test_stream_happy_path_records_ttft_and_usage(routed):
    usage = {
        "prompt_tokens": 8,
        "completion_tokens": 2,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    script = Script(stream_response([chunk("Hel"), chunk("lo", finish="stop"), chunk(usage=usage)]))
    stream = routed(script).chat(MSG, stream=True)
    assert list(stream) == ["Hel", "lo"]
    assert stream.result.text == "Hello"
    assert stream.result.ttft_ms is not None and stream.result.ttft_ms >= 0
    assert stream.result.usage.completion_tokens == 2


def test_stream_failing_before_first_token_falls_back(routed):
    def broken_at_start(request):
        def body():
            raise httpx2.RemoteProtocolError("peer closed connection", request=request)
            yield b""  # pragma: no cover

        return httpx2.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    client = routed(Script(broken_at_start))
    stream = client.chat(MSG, stream=True)
    text = "".join(stream)
    assert text.startswith("[simulated direct/")
    assert stream.result.provider == "direct" and stream.result.fallback_used


def test_stream_ending_without_finish_before_text_falls_back(routed):
    client = routed(Script(stream_response([chunk(None)])))
    stream = client.chat(MSG, stream=True)
    "".join(stream)
    assert stream.result.provider == "direct"
    assert stream.result.attempt_log[0].error_class == "bad_response"


def test_stream_broken_after_first_token_is_an_error_not_truncation(routed):
    def breaks_later(request):
        def body():
            yield f"data: {json.dumps(chunk('partial '))}\n\n".encode()
            raise httpx2.RemoteProtocolError("connection reset", request=request)

        return httpx2.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    client = routed(Script(breaks_later))
    stream = client.chat(MSG, stream=True)
    got = []
    with pytest.raises(StreamBrokenError, match="incomplete"):
        for piece in stream:
            got.append(piece)
    assert got == ["partial "]
    assert stream.result is None
    client.flush()
    from sqlalchemy import select

    from db.models import RequestLog

    with client.engine.connect() as conn:
        rows = conn.execute(select(RequestLog.error_class, RequestLog.final)).all()
    assert rows == [("stream_broken", True)]


def test_stream_truncated_after_text_without_finish_is_an_error(routed):
    client = routed(Script(stream_response([chunk("only half")])))
    stream = client.chat(MSG, stream=True)
    with pytest.raises(StreamBrokenError):
        list(stream)
