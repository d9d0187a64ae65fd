"""The retry and fallback matrix of the RoutingClient, through the real openai SDK.

The primary is a scripted MockTransport; the fallback is the built-in simulator. The canary ratio is
set to 1.0 so every request is assigned to the primary first.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._utils import maybe_transform
from openai.types.chat import completion_create_params
from sqlalchemy import create_engine, inspect, text

from app.routing import AllRoutesFailed, RouteOptions, RoutingClient, StreamBrokenError
from app.routing.io.async_client import AsyncRoutingClient
from app.routing.io.client import VALID_ROLES
from app.routing.io.sdk import sdk_settings
from db.canary import set_ratio
from tests.configs import two_providers
from tests.support.examples import examples


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


# -- sdk request -----------------------------------------------------------------------------------
# Both drivers send each upstream exactly what the openai SDK's ``chat.completions.create`` sends.
#
# They call the SDK's ``client.post`` with a body they build (``RoutingClient._request``), skipping
# only ``create``'s parameter transform, which costs 0.3 ms a call. These tests hold that shortcut to
# the SDK: the same JSON body and the same headers as ``create`` for the same parameters, streamed or
# not, with and without cache hints; and the transform is the identity on every body we can build.


MODEL = "gemini-2.5-flash"
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "héllo \U0001f600"}]},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "and again"},
]
# Headers that differ between any two SDK calls (the SDK's own per-call values).
PER_CALL = {"x-stainless-retry-count", "x-stainless-read-timeout", "content-length"}


def answer(request: httpx2.Request) -> httpx2.Response:
    if json.loads(request.content).get("stream"):
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        body = sse([chunk("ok"), chunk(finish="stop"), chunk(usage=usage)])
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})
    return httpx2.Response(200, json=completion())


@pytest.fixture
def routed_sdk_request(client_factory, sqlite_url):
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer(request)

    client = client_factory(sqlite_url, transports={"holysheep": httpx2.MockTransport(handler)})
    set_ratio(client.engine, 1.0, expected_version=None, actor="test", reason="all to primary")
    client.refresh()
    return client, seen


def sent(request: httpx2.Request) -> tuple[dict, dict]:
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in PER_CALL}
    return json.loads(request.content), headers


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("chat", "params"),
    [
        ({}, {}),
        ({"max_tokens": 7, "temperature": 0.5}, {"max_tokens": 7, "temperature": 0.5}),
        ({"session_id": "세션-7"}, {}),
    ],
)
def test_both_drivers_send_what_create_sends(routed_sdk_request, stream, chat, params):
    """The sync client (a portal over the async driver) and the async driver send, byte for byte,
    the body and headers the SDK's own ``create`` sends for the same call."""
    client, seen = routed_sdk_request
    result = client.chat(MESSAGES, MODEL, stream=stream, **chat)
    if stream:
        assert "".join(result) == "ok"
    ours = sent(seen[-1])
    hints = seen[-1].headers.get("x-session-id")
    extra = {"x-session-id": hints, "x-cache-controls": "session_scope"} if hints else None

    async def via_async() -> tuple[tuple[dict, dict], tuple[dict, dict]]:
        async with AsyncRoutingClient(client) as driver:
            if stream:
                assert "".join([p async for p in driver.chat_stream(MESSAGES, MODEL, **chat)]) == "ok"
            else:
                assert (await driver.chat(MESSAGES, MODEL, **chat)).text
            ours_async = sent(seen[-1])
            # The SDK's own client, over the same transport: what ``create`` sends for the same call.
            kw = sdk_settings(client.settings, "holysheep", client.core.env, client.core.secrets)
            sdk = openai.AsyncOpenAI(**kw, http_client=httpx2.AsyncClient(transport=client.transports["holysheep"]))
            more = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            got = await sdk.chat.completions.create(
                model=MODEL, messages=MESSAGES, extra_headers=extra, **params, **more
            )
            if stream:
                [c async for c in got]
            return ours_async, sent(seen[-1])

    ours_async, theirs = asyncio.run(via_async())
    assert ours[0] == ours_async[0] == theirs[0]  # the same JSON body
    assert ours[1] == ours_async[1] == theirs[1]  # the same headers, key and session hints included
    assert ours[1]["authorization"].startswith("Bearer ")
    assert ("x-session-id" in ours[1]) == ("session_id" in chat)


texts = st.text(max_size=40)
parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), min_size=1, max_size=3)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(sorted(VALID_ROLES)), "content": texts | parts}),
    min_size=1,
    max_size=4,
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    msgs=messages,
    stream=st.booleans(),
    max_tokens=st.none() | st.integers(1, 10**6),
    temperature=st.none() | st.floats(0, 2),
)
def test_the_sdk_transform_is_the_identity_on_every_body_we_build(
    routed_sdk_request, msgs, stream, max_tokens, temperature
):
    client, _ = routed_sdk_request
    params = {k: v for k, v in {"temperature": temperature, "max_tokens": max_tokens}.items() if v is not None}
    plan = client.core.plan("chat", {"messages": msgs, **params}, RouteOptions(model=MODEL, stream=stream))
    attempt = next(client.core.attempts(plan))
    body = client.core.request(plan, attempt).body
    shape = (
        completion_create_params.CompletionCreateParamsStreaming
        if stream
        else completion_create_params.CompletionCreateParamsNonStreaming
    )
    assert maybe_transform(body, shape) == body


# -- secrets ---------------------------------------------------------------------------------------
# Secrets never reach the database, prompts only on opt-in, and a missing key is a clear error.
#
# A non-simulated provider is configured with a real-looking https URL; the test injects a
# MockTransport for it (no network) that answers in the OpenAI wire format and checks the key arrives
# in the Authorization header, i.e. the key is really in use while we look for it in storage.


SECRET = "sk-live-SECRET-abc123"
PROMPT_MARKER = "zebra-PROMPT-MARKER-7f3a"
FAIL_MARKER = "please-FAIL-now"

TOML = """
[routing]
primary = "gw"
fallback = "direct"
initial_ratio = 1.0
fallback_enabled = {fallback_enabled}

[providers.gw]
base_url = "https://gateway.example.test/v1"
api_key_env = "TEST_GW_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[providers.direct]
base_url = "sim://direct"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[telemetry]
store_prompts = {store_prompts}
"""


def toml(*, store_prompts: bool = False, fallback_enabled: bool = True) -> str:
    return TOML.format(store_prompts=str(store_prompts).lower(), fallback_enabled=str(fallback_enabled).lower())


class Upstream:
    """An OpenAI-compatible upstream on a MockTransport; fails requests whose prompt has FAIL_MARKER."""

    def __init__(self, key: str = SECRET) -> None:
        self.key = key
        self.requests: list[httpx2.Request] = []
        self.auth_ok: list[bool] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        ok = request.headers.get("authorization") == f"Bearer {self.key}"
        self.auth_ok.append(ok)
        assert request.url.host == "gateway.example.test"
        if not ok:
            return httpx2.Response(401, json={"error": {"message": "invalid api key", "type": "auth"}})
        if request.url.path != "/v1/chat/completions":
            return httpx2.Response(404, json={"error": {"message": "no such route"}})
        body = json.loads(request.content)
        prompt = " ".join(str(m.get("content")) for m in body["messages"])
        if FAIL_MARKER in prompt:
            return httpx2.Response(500, json={"error": {"message": "upstream exploded", "type": "server_error"}})
        model = body["model"]
        usage = {
            "prompt_tokens": 11,
            "completion_tokens": 3,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if body.get("stream"):

            def chunk(delta: dict, finish: str | None) -> str:
                return (
                    "data: "
                    + json.dumps(
                        {
                            "id": "chatcmpl-gw",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        }
                    )
                    + "\n\n"
                )

            events = [
                chunk({"role": "assistant", "content": "hello "}, None),
                chunk({"content": "from gw"}, None),
                chunk({}, "stop"),
            ]
            events.append(
                "data: "
                + json.dumps(
                    {
                        "id": "chatcmpl-gw",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
                + "\n\n"
            )
            events.append("data: [DONE]\n\n")
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content="".join(events).encode())
        return httpx2.Response(
            200,
            json={
                "id": "chatcmpl-gw",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello from gw"}, "finish_reason": "stop"}
                ],
                "usage": usage,
            },
        )


def _db_text(url: str) -> bytes:
    """Everything the database holds, as bytes: the SQLite file (+WAL), or every row of every table."""
    from db.engine import dispose_all

    dispose_all()
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        data = path.read_bytes()
        for suffix in ("-wal", "-journal"):
            side = Path(str(path) + suffix)
            if side.exists():
                data += side.read_bytes()
        assert len(data) > 0
        return data
    engine = create_engine(url)
    try:
        chunks: list[str] = []
        with engine.connect() as conn:
            tables = inspect(engine).get_table_names()
            assert "request_log" in tables
            for table in tables:
                cols = [c["name"] for c in inspect(engine).get_columns(table) if c["type"].python_type is str]
                for col in cols:
                    chunks.extend(
                        str(v) for v in conn.execute(text(f'SELECT "{col}" FROM "{table}"')).scalars() if v is not None
                    )
                # And the whole row as text, whatever the column types.
                chunks.extend(conn.execute(text(f'SELECT CAST(t AS text) FROM "{table}" t')).scalars())
        return "\n".join(chunks).encode()
    finally:
        engine.dispose()


def _send_traffic(client: RoutingClient) -> list[str]:
    ids = []
    r = client.chat([{"role": "user", "content": f"hello {PROMPT_MARKER}"}], session_id="sess-1")
    assert r.provider == "gw" and r.text == "hello from gw"
    ids.append(r.request_id)
    r = client.chat([{"role": "user", "content": f"explain {PROMPT_MARKER}"}], model="gpt-4.1")
    assert r.provider == "gw"
    ids.append(r.request_id)
    stream = client.chat([{"role": "user", "content": f"stream {PROMPT_MARKER}"}], stream=True)
    assert "".join(stream) == "hello from gw"
    assert stream.result is not None and stream.result.provider == "gw"
    ids.append(stream.result.request_id)
    # A 500 from the real provider: retried, then served by the simulated fallback.
    r = client.chat([{"role": "user", "content": f"{FAIL_MARKER} {PROMPT_MARKER}"}])
    assert r.fallback_used and r.provider == "direct"
    assert any(a.http_status == 500 for a in r.attempt_log)
    assert SECRET not in json.dumps(r.to_dict(), default=str)
    ids.append(r.request_id)
    return ids


def _rows(url: str) -> list[dict]:
    from sqlalchemy import select

    from db.engine import get_engine
    from db.models import RequestLog

    with get_engine(url).connect() as conn:
        return [dict(r) for r in conn.execute(select(RequestLog)).mappings().all()]


def test_api_key_never_reaches_the_database(db_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        db_url, toml(), transports={"gw": httpx2.MockTransport(up.handler)}, env={"TEST_GW_KEY": SECRET}
    )
    _send_traffic(client)
    client.close()
    assert up.requests and all(up.auth_ok), "the key was not sent in the Authorization header"

    rows = _rows(db_url)
    assert any(r["status"] == "error" and r["http_status"] == 500 and r["provider"] == "gw" for r in rows)
    assert sum(r["final"] for r in rows) == 4
    assert all(r["prompt_text"] is None for r in rows)

    data = _db_text(db_url)
    assert SECRET.encode() not in data
    assert b"SECRET-abc123" not in data
    assert b"Authorization" not in data and b"authorization" not in data
    assert b"Bearer" not in data
    # Prompts are not stored unless the operator opts in.
    assert PROMPT_MARKER.encode() not in data
    # Sanity: the dump does contain what was logged.
    assert b"gemini-2.5-flash" in data or b"gpt-4.1" in data
    assert b"upstream exploded" in data


def test_prompts_are_stored_only_when_opted_in_and_still_no_key(db_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        db_url,
        toml(store_prompts=True),
        transports={"gw": httpx2.MockTransport(up.handler)},
        env={"TEST_GW_KEY": SECRET},
    )
    _send_traffic(client)
    client.close()
    rows = _rows(db_url)
    assert rows and all(PROMPT_MARKER in (r["prompt_text"] or "") for r in rows)

    data = _db_text(db_url)
    assert PROMPT_MARKER.encode() in data
    assert SECRET.encode() not in data
    assert b"Bearer" not in data


def test_missing_key_is_a_clear_error_with_no_fallback(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    # Construction succeeds without the key: it is only needed when the provider is used.
    client = client_factory(
        sqlite_url, toml(fallback_enabled=False), transports={"gw": httpx2.MockTransport(up.handler)}, env={}
    )
    with pytest.raises(AllRoutesFailed) as info:
        client.chat([{"role": "user", "content": "hi"}])
    assert "not configured: set TEST_GW_KEY" in str(info.value)
    assert info.value.attempts and "not configured: set TEST_GW_KEY" in (info.value.attempts[0].error or "")
    assert info.value.attempts[0].error_class == "not_configured"
    assert up.requests == []  # nothing was sent without a key
    client.close()
    rows = _rows(sqlite_url)
    assert len(rows) == 1
    assert rows[0]["status"] == "error" and "TEST_GW_KEY" in rows[0]["error_message"]


def test_missing_key_falls_back_and_says_why(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        sqlite_url, toml(), transports={"gw": httpx2.MockTransport(up.handler)}, env={"UNRELATED": "x"}
    )
    r = client.chat([{"role": "user", "content": "hi"}])
    assert r.provider == "direct" and r.fallback_used
    assert r.attempt_log[0].provider == "gw"
    assert "not configured: set TEST_GW_KEY" in (r.attempt_log[0].error or "")
    assert up.requests == []


def test_wrong_key_is_refused_by_upstream_and_not_stored(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        sqlite_url,
        toml(fallback_enabled=False),
        transports={"gw": httpx2.MockTransport(up.handler)},
        env={"TEST_GW_KEY": "sk-live-WRONG-999"},
    )
    with pytest.raises(AllRoutesFailed) as info:
        client.chat([{"role": "user", "content": "hi"}])
    assert info.value.attempts[0].error_class == "auth"
    assert up.auth_ok == [False]
    client.close()
    data = _db_text(sqlite_url)
    assert b"sk-live-WRONG-999" not in data
    assert b"Bearer" not in data


def test_key_state_reports_presence_never_the_key(settings_factory) -> None:
    from app.config import ProviderNotConfigured, key_state, resolve_api_key

    s = settings_factory(toml())
    gw = s.providers["gw"]
    assert key_state(gw, env={}) == "missing"
    assert key_state(gw, env={"TEST_GW_KEY": SECRET}) == "set"
    assert key_state(s.providers["direct"], env={}) == "simulated"
    assert resolve_api_key("gw", gw, env={"TEST_GW_KEY": SECRET}) == SECRET
    with pytest.raises(ProviderNotConfigured, match="not configured: set TEST_GW_KEY"):
        resolve_api_key("gw", gw, env={})
    assert SECRET not in s.model_dump_json()
