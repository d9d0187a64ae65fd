"""The gateway as a transparent OpenAI proxy (issue 15), end to end in one process: the server's
ASGI app and handler, the async driver and the routing core, over real loopback HTTP to a scripted
upstream that records what it receives.

What the caller sends reaches the upstream as sent (less what the gateway owns: ``model``, the
hint headers, ``stream_options.include_usage``, a provider's drop/rename rules); what the upstream
answers reaches the caller whole (every choice, tool calls, logprobs, usage details, unknown
fields), streams chunk by chunk and unmerged; errors keep their status and error object.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest
from sqlalchemy import text

from app.config import load_settings
from app.gateway import build_gateway
from app.monitor.drilldown import load_story
from app.server.asgi import GatewayApp
from app.server.handler import ChatHandler
from app.server.serve import build_server, served_models
from db.canary import set_ratio
from db.keys import create_key
from tests.support.chaos_upstream import ChaosUpstream, Fault
from tests.support.serve_process import chaos_config

KEY = "sk-upstream-secret-for-scrubbing"
ORIGIN = "https://app.example.com"


def _provider(name: str, url: str, extra: str = "") -> str:
    return (
        f'[providers.{name}]\nbase_url = "{url}/{name}/v1"\napi_key_env = "CHAOS_KEY"\n'
        f'models = ["gpt-4.1", "gemini-2.5-flash", "text-embedding-3-small"]\ndefault_model = "gpt-4.1"\n{extra}'
    )


def json_fault(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Fault:
    return Fault("json", lambda h, req: h.send_json(status, body, headers))


def sse_fault(events: list[object], *, named: bool = False, done: bool = True) -> Fault:
    out = b""
    for e in events:
        if named and isinstance(e, dict):
            out += f"event: {e['type']}\n".encode()
        out += b"data: " + json.dumps(e).encode() + b"\n\n"
    if done:
        out += b"data: [DONE]\n\n"
    return Fault(
        "sse", lambda h, req: h.send_raw(200, out, "text/event-stream", {"x-ratelimit-remaining-requests": "9"})
    )


def chunk(choices: list[dict], **extra: object) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-model",
        "choices": choices,
        **extra,
    }


class Proxy:
    """The gateway app on a scripted upstream, and clients to call it."""

    def __init__(self, up: ChaosUpstream, tmp_path: Path, *, direct: str = "", holysheep: str = "", ratio: float = 0):
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(
            f'[routing]\nprimary = "holysheep"\nfallback = "direct"\ninitial_ratio = {ratio}\n'
            "[retry]\nmax_attempts = 1\nbase_delay_s = 0\n[telemetry]\nflush_interval_s = 0.05\n"
            f'[server]\ncors_origins = ["{ORIGIN}"]\n'
            + _provider("holysheep", up.url, holysheep)
            + _provider("direct", up.url, direct)
        )
        env = {"CHAOS_KEY": KEY, "DATABASE_URL": f"sqlite:///{tmp_path / 'gw.sqlite'}"}
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()  # one loop: the driver's upstream connections live on it
        self.gateway = build_gateway(load_settings(cfg, env=env), env=env, stop=self.stop, guardrail=False)
        self.handler = ChatHandler(self.gateway.client, engine=self.gateway.engine)
        s = self.gateway.settings
        self.app = GatewayApp(
            chat_handler=self.handler,
            models=served_models(self.gateway),
            authenticate=None,
            cors_origins=s.server.cors_origins,
            forward_headers=any(p.forward_headers for p in s.providers.values()),
        )

    def http(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=self.app), base_url="http://gw")

    def sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://gw/v1", api_key="unused", http_client=self.http(), max_retries=0)

    def rows(self) -> list[dict]:
        self.gateway.client.flush()
        with self.gateway.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text("select * from request_log order by id"))]

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.handler.aclose())
        self.loop.close()
        self.gateway.close()


@pytest.fixture
def up() -> Iterator[ChaosUpstream]:
    with ChaosUpstream() as u:
        yield u


@pytest.fixture
def proxy_factory(up: ChaosUpstream, tmp_path: Path):
    made: list[Proxy] = []

    def make(**kw: object) -> Proxy:
        p = Proxy(up, tmp_path / str(len(made)), **kw)  # type: ignore[arg-type]
        made.append(p)
        return p

    for i in range(4):
        (tmp_path / str(i)).mkdir()
    yield make
    for p in made:
        p.close()


def post(proxy: Proxy, path: str, body: dict, headers: dict[str, str] | None = None) -> httpx2.Response:
    async def go() -> httpx2.Response:
        async with proxy.http() as c:
            return await c.post(path, json=body, headers=headers or {})

    return proxy.run(go())


def sse_payloads(response: httpx2.Response) -> list[object]:
    out: list[object] = []
    for block in response.text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --------------------------------------------------------------------------------- requests as sent
EVERY_PARAM = {
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
    },
    "stop": ["END"],
    "seed": 7,
    "top_p": 0.5,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "top_logprobs": 2,
    "reasoning_effort": "low",
    "verbosity": "low",
    "user": "end-user-1",
    "store": True,
    "metadata": {"team": "a"},
    "service_tier": "flex",
    "prediction": {"type": "content", "content": "x"},
    "modalities": ["text"],
    "web_search_options": {},
    "safety_identifier": "sid",
    "prompt_cache_key": "pck",
    "max_completion_tokens": 50,
    "n": 2,
    "a_field_from_next_year": {"nested": [1, 2.5, None]},
}


def test_every_parameter_reaches_the_upstream_as_sent(proxy_factory, up):
    proxy = proxy_factory()
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}], **EVERY_PARAM}
    r = post(proxy, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    (seen,) = up.requests_for("direct")
    assert seen.path == "/direct/v1/chat/completions"
    assert seen.json == body  # the same model here; every field, the unknown one too, unchanged


def test_auto_gets_the_routed_model_and_nothing_else_changes(proxy_factory, up):
    proxy = proxy_factory()
    body = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "seed": 1}
    assert post(proxy, "/v1/chat/completions", body).status_code == 200
    seen = up.requests_for("direct")[0].json
    assert seen.pop("model") != "auto"
    assert seen == {k: v for k, v in body.items() if k != "model"}


def test_a_stream_asks_for_usage_upstream_and_withholds_it_from_a_caller_that_did_not(proxy_factory, up):
    proxy = proxy_factory()
    events = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], usage=None),
        chunk([{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}], usage=None),
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=None),
        chunk([], usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}),
    ]
    up.script(sse_fault(events), sse_fault(events), provider="direct")
    msgs = [{"role": "user", "content": "hi"}]
    plain = post(proxy, "/v1/chat/completions", {"model": "gpt-4.1", "messages": msgs, "stream": True})
    asked = post(
        proxy,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": msgs, "stream": True, "stream_options": {"include_usage": True}},
    )
    sent = [q.json for q in up.requests_for("direct")]
    assert [s["stream_options"] for s in sent] == [{"include_usage": True}, {"include_usage": True}]
    got_plain, got_asked = sse_payloads(plain), sse_payloads(asked)
    assert got_plain[-1] == got_asked[-1] == "[DONE]"
    assert all("usage" not in c for c in got_plain[:-1]) and len(got_plain) == 4
    assert got_asked[-2]["usage"]["total_tokens"] == 4 and got_asked[-2]["choices"] == []
    assert plain.headers["x-ratelimit-remaining-requests"] == "9"


# ---------------------------------------------------------------------------------- answers whole
ANSWER = {
    "id": "chatcmpl-up",
    "object": "chat.completion",
    "created": 5,
    "model": "gpt-4.1-2025-04-14",
    "system_fingerprint": "fp_up",
    "service_tier": "default",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"c":1}'}}
                ],
            },
            "logprobs": {"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]},
            "finish_reason": "tool_calls",
        },
        {"index": 1, "message": {"role": "assistant", "content": "second"}, "logprobs": None, "finish_reason": "stop"},
    ],
    "usage": {
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "total_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 8, "audio_tokens": 0},
    },
    "an_unknown_field": [1],
}


def test_the_answer_is_the_upstreams_with_the_routed_model(proxy_factory, up):
    proxy = proxy_factory()
    headers = {"x-ratelimit-remaining-tokens": "99", "openai-processing-ms": "12", "x-other": "no"}
    up.script(json_fault(ANSWER, headers=headers), provider="direct")
    r = post(proxy, "/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": "w"}]})
    assert r.status_code == 200
    assert r.json() == {**ANSWER, "model": "gpt-4.1"}
    assert r.headers["x-ratelimit-remaining-tokens"] == "99" and r.headers["openai-processing-ms"] == "12"
    assert "x-other" not in r.headers and r.headers["x-gateway-provider"] == "direct"
    (row,) = proxy.rows()
    assert (row["api"], row["finish_reason"], row["tool_calls"], row["reasoning_tokens"]) == (
        "chat",
        "tool_calls",
        1,
        8,
    )
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (10, 4, 20)


def test_the_sdk_reads_tool_calls_and_the_second_leg_is_accepted(proxy_factory, up):
    proxy = proxy_factory()
    up.script(json_fault(ANSWER), provider="direct")

    async def go() -> tuple[object, object]:
        async with proxy.sdk() as c:
            first = await c.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "w"}])
            call = first.choices[0].message.tool_calls[0]
            second = await c.chat.completions.create(
                model="gpt-4.1",
                messages=[
                    {"role": "user", "content": "w"},
                    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
                ],
            )
            return first, second

    first, second = proxy.run(go())
    assert second.choices[0].message.content == "chaos says hello"  # the upstream's default answer
    assert first.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert first.choices[1].message.content == "second"
    assert first.usage.completion_tokens_details.reasoning_tokens == 8
    sent = up.requests_for("direct")[1].json["messages"]
    assert sent[1]["content"] is None and sent[1]["tool_calls"][0]["id"] == "call_1" and sent[2]["role"] == "tool"


def test_messages_of_every_shape_are_forwarded_unchanged(proxy_factory, up):
    proxy = proxy_factory()
    messages = [
        {"role": "developer", "content": "be brief", "name": "ops"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "file", "file": {"file_id": "file-1"}},
            ],
        },
    ]
    r = post(proxy, "/v1/chat/completions", {"model": "gpt-4.1", "messages": messages})
    assert r.status_code == 200
    assert up.requests_for("direct")[0].json["messages"] == messages


def test_a_stream_is_forwarded_chunk_by_chunk_unmerged(proxy_factory, up):
    proxy = proxy_factory()
    calls = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "f", "arguments": ""}}
    events = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [calls]}}]),
        chunk([{"index": 1, "delta": {"role": "assistant", "content": "b1"}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}]),
        chunk([{"index": 1, "delta": {"content": "b2"}, "finish_reason": None}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]),
        chunk(
            [
                {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
                {"index": 1, "delta": {}, "finish_reason": "stop"},
            ]
        ),
        chunk([], usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}),
    ]
    up.script(sse_fault(events), provider="direct")
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2}
    body["stream_options"] = {"include_usage": True}
    r = post(proxy, "/v1/chat/completions", body)
    got = sse_payloads(r)
    assert got[-1] == "[DONE]"
    assert got[:-1] == [{**e, "model": "gpt-4.1"} for e in events]
    (row,) = proxy.rows()
    assert (row["finish_reason"], row["tool_calls"], row["completion_tokens"]) == ("tool_calls", 1, 5)


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def _asgi_messages(app: GatewayApp, body: dict) -> list[dict]:
    """Every message the app sends for one POST /v1/chat/completions (the writes a server makes)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("gw", 80),
        "scheme": "http",
        "http_version": "1.1",
    }
    sent: list[dict] = []
    given = False
    done = asyncio.Event()

    async def receive() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    done.set()
    return sent


def test_a_compact_stream_passes_through_as_the_upstreams_bytes_in_one_write_per_read(proxy_factory, up):
    proxy = proxy_factory()
    head = chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], usage=None)
    words = [
        chunk([{"index": 0, "delta": {"content": w}, "finish_reason": None}], usage=None) for w in ("a", '"b"', "c")
    ]
    tail = [
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}], usage=None),
        chunk([], usage={"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}),
    ]
    events = [head, *words, *tail]
    # ``1E0``: a spelling a parser re-encoding the chunk would write as ``1.0``
    raw = b"".join(b"data: " + _compact(e).replace(b'"created":1', b'"created":1E0') + b"\n\n" for e in events)
    raw += b"data: [DONE]\n\n"
    sse = Fault("sse", lambda h, req: h.send_raw(200, raw, "text/event-stream"))
    up.script(sse, sse, provider="direct")
    msgs = [{"role": "user", "content": "hi"}]
    sent = proxy.run(_asgi_messages(proxy.app, {"model": "gpt-4.1", "messages": msgs, "stream": True}))
    writes = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    assert len(writes) == 1, writes  # the upstream's one write is one write to the caller, [DONE] in it
    lines = writes[0].split(b"\n\n")[:-1]
    # The content chunks are the upstream's bytes, but for the routed model and the usage the
    # gateway asked for itself; the chunks the accounting read say the same, re-encoded.
    # The first output is read (its time is the TTFT); the chunks after it pass.
    for line, word in zip(lines[2:4], words[1:], strict=True):
        expected = _compact(word).replace(b'"model":"up-model"', b'"model":"gpt-4.1"').replace(b',"usage":null}', b"}")
        expected = expected.replace(b'"created":1', b'"created":1E0')
        assert line == b"data: " + expected
    assert [json.loads(x[6:]) for x in lines[:2] + lines[4:5]] == [
        {k: v for k, v in {**e, "model": "gpt-4.1"}.items() if k != "usage"} for e in (head, words[0], tail[0])
    ]
    assert b'"created":1.0' in lines[1]  # read and written again
    assert lines[5:] == [b"data: [DONE]"]
    # A caller that asked for usage gets every chunk's usage, as the upstream sent it.
    asked = {"model": "gpt-4.1", "messages": msgs, "stream": True, "stream_options": {"include_usage": True}}
    sent = proxy.run(_asgi_messages(proxy.app, asked))
    body = b"".join(m["body"] for m in sent if m["type"] == "http.response.body")
    passed = _compact({**words[1], "model": "gpt-4.1"}).replace(b'"created":1', b'"created":1E0')
    assert b"data: " + passed + b"\n\n" in body
    assert json.loads(body.split(b"\n\n")[-3][6:])["usage"]["total_tokens"] == 6
    rows = proxy.rows()
    assert [(r["status"], r["completion_tokens"], r["finish_reason"]) for r in rows] == [("ok", 3, "stop")] * 2


# ------------------------------------------------------------------------------------------- errors
def test_an_upstream_refusal_keeps_its_status_and_error_object_scrubbed(proxy_factory, up):
    proxy = proxy_factory()
    err = {"error": {"message": f"tools[0] is invalid (key {KEY})", "type": "invalid_request_error",
                     "param": "tools", "code": "invalid_tools"}}  # fmt: skip
    up.script(json_fault(err, status=422), provider="direct")
    r = post(proxy, "/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 422
    got = r.json()["error"]
    assert (got["type"], got["param"], got["code"]) == ("invalid_request_error", "tools", "invalid_tools")
    assert KEY not in r.text and "tools[0] is invalid" in got["message"]


def test_an_upstream_429_with_nowhere_to_go_is_a_429_with_its_retry_after(proxy_factory, up):
    proxy = proxy_factory()
    err = {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}
    up.script(json_fault(err, status=429, headers={"retry-after": "7"}), provider="direct")

    async def go() -> openai.RateLimitError:
        async with proxy.sdk() as c:
            with pytest.raises(openai.RateLimitError) as info:
                await c.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "x"}])
            return info.value

    exc = proxy.run(go())
    assert exc.status_code == 429 and exc.response.headers["retry-after"] == "7"
    assert exc.body["message"] == "slow down"


# -------------------------------------------------------------------------------- the other APIs
def test_embeddings_route_and_log_their_tokens_and_cost(proxy_factory, up):
    proxy = proxy_factory()
    answer = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}, {"object": "embedding", "index": 1,
                                                                                "embedding": [0.3, 0.4]}],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 1000, "total_tokens": 1000},
    }  # fmt: skip
    up.script(json_fault(answer), provider="direct")

    async def go():
        async with proxy.sdk() as c:
            return await c.embeddings.create(model="auto", input=["a", "b"], dimensions=2)

    got = proxy.run(go())
    assert [d.embedding for d in got.data] == [[0.1, 0.2], [0.3, 0.4]]
    seen = up.requests_for("direct")[0]
    assert seen.path == "/direct/v1/embeddings"
    assert seen.json == {"model": "text-embedding-3-small", "input": ["a", "b"], "dimensions": 2,
                           "encoding_format": "base64"} or seen.json["input"] == ["a", "b"]  # fmt: skip
    (row,) = proxy.rows()
    assert (row["api"], row["prompt_tokens"]) == ("embeddings", 1000)
    assert row["cost_usd"] == pytest.approx(1000 * 0.02 / 1e6)


def test_legacy_completions_pass_through(proxy_factory, up):
    proxy = proxy_factory()
    answer = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "x",
              "choices": [{"text": " world", "index": 0, "logprobs": None, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}  # fmt: skip
    up.script(json_fault(answer), provider="direct")
    r = post(proxy, "/v1/completions", {"model": "gpt-4.1", "prompt": "hello", "echo": False, "suffix": "!"})
    assert r.status_code == 200 and r.json() == {**answer, "model": "gpt-4.1"}
    seen = up.requests_for("direct")[0]
    assert seen.path == "/direct/v1/completions" and seen.json["suffix"] == "!"


RESPONSE = {
    "id": "resp_abc",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "x",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hello there", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 7,
              "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 12},
}  # fmt: skip


def test_responses_plain_and_previous_response_id_goes_back_to_its_provider(proxy_factory, up):
    proxy = proxy_factory()
    up.set_default(json_fault(RESPONSE), provider="direct")
    up.set_default(json_fault({**RESPONSE, "id": "resp_other"}), provider="holysheep")
    r = post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "hi", "instructions": "be kind"})
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "hello there"
    set_ratio(proxy.gateway.engine, 1.0, expected_version=None, actor="t", reason="everything to holysheep")
    proxy.gateway.refresh()
    post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "new"})
    post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "more", "previous_response_id": "resp_abc"})
    paths = [(q.provider, q.json.get("previous_response_id")) for q in up.requests]
    assert paths == [("direct", None), ("holysheep", None), ("direct", "resp_abc")]
    rows = proxy.rows()
    assert rows[0]["api"] == "responses" and rows[0]["reasoning_tokens"] == 2


def test_responses_stream_keeps_its_named_events(proxy_factory, up):
    proxy = proxy_factory()
    events = [
        {"type": "response.created", "sequence_number": 0,
         "response": {**RESPONSE, "status": "in_progress", "output": []}},
        {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": "hel"},
        {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "msg_1", "output_index": 0,
         "content_index": 0, "delta": "lo"},
        {"type": "response.completed", "sequence_number": 3, "response": RESPONSE},
    ]  # fmt: skip
    up.script(sse_fault(events, named=True, done=False), provider="direct")

    async def go() -> list:
        async with proxy.sdk() as c:
            stream = await c.responses.create(model="gpt-4.1", input="hi", stream=True)
            return [e async for e in stream]

    got = proxy.run(go())
    assert [e.type for e in got] == [e["type"] for e in events]
    assert got[-1].response.usage.output_tokens == 7 and got[-1].response.model == "gpt-4.1"
    (row,) = proxy.rows()
    assert (row["api"], row["completion_tokens"], row["finish_reason"]) == ("responses", 7, "completed")


def test_an_api_no_provider_serves_is_refused_by_name_and_logged(proxy_factory, up):
    proxy = proxy_factory(direct='apis = ["chat"]\n', holysheep='apis = ["chat", "completions"]\n')
    r = post(proxy, "/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"})
    assert r.status_code == 400 and "embeddings API" in r.json()["error"]["message"]
    assert up.requests == []
    (row,) = proxy.rows()
    assert (row["api"], row["status"], row["error_class"], row["final"]) == ("embeddings", "error", "no_route", True)


def test_an_api_served_by_the_other_side_only_goes_there(proxy_factory, up):
    proxy = proxy_factory(direct='apis = ["chat"]\n')  # the canary ratio sends everything to direct
    answer = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [1.0]}], "model": "m",
              "usage": {"prompt_tokens": 1, "total_tokens": 1}}  # fmt: skip
    up.script(json_fault(answer), provider="holysheep")
    r = post(proxy, "/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"})
    assert r.status_code == 200 and [q.provider for q in up.requests] == ["holysheep"]


# ----------------------------------------------------------------------------- provider rules
def test_drop_and_rename_params_apply_per_provider_and_are_on_the_attempt(proxy_factory, up):
    proxy = proxy_factory(
        direct='drop_params = ["service_tier"]\nrename_params = { max_completion_tokens = "max_tokens" }\n'
    )
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}], "service_tier": "flex",
            "max_completion_tokens": 9}  # fmt: skip
    assert post(proxy, "/v1/chat/completions", body).status_code == 200
    seen = up.requests_for("direct")[0].json
    assert "service_tier" not in seen and seen["max_tokens"] == 9 and "max_completion_tokens" not in seen
    result = proxy.gateway.client.chat([{"role": "user", "content": "x"}], "gpt-4.1", service_tier="flex")
    assert result.attempt_log[0].adjusted_params == ("-service_tier",)
    rows = proxy.rows()
    assert [r["adjusted_params"] for r in rows] == ["-service_tier,max_completion_tokens->max_tokens", "-service_tier"]
    story = load_story(proxy.gateway.engine, rows[0]["request_id"])
    assert story is not None and story.timeline_rows()[0]["params changed"] == rows[0]["adjusted_params"]


def test_only_allow_listed_client_headers_are_forwarded(proxy_factory, up):
    proxy = proxy_factory(direct='forward_headers = ["OpenAI-Organization"]\n')
    headers = {"openai-organization": "org-1", "x-secret-internal": "no"}
    post(proxy, "/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}]}, headers)
    seen = up.requests_for("direct")[0].headers
    assert seen["openai-organization"] == "org-1" and "x-secret-internal" not in seen
    assert seen["authorization"] == f"Bearer {KEY}"


def test_a_forwarded_header_sent_twice_or_with_a_control_character_is_a_400_and_reaches_no_upstream(proxy_factory, up):
    proxy = proxy_factory(direct='forward_headers = ["openai-organization"]\n')
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}]}

    async def go(headers: list[tuple[str, str]]) -> httpx2.Response:
        async with proxy.http() as c:
            return await c.post("/v1/chat/completions", json=body, headers=headers)

    twice = proxy.run(go([("OpenAI-Organization", "org-1"), ("openai-organization", "org-2")]))
    assert twice.status_code == 400 and "more than once" in twice.json()["error"]["message"]
    control = proxy.run(go([("openai-organization", "org\x7f1")]))
    assert control.status_code == 400 and "control character" in control.json()["error"]["message"]
    assert up.requests_for("direct") == []


# ------------------------------------------------------------------------------- models and CORS
def test_models_retrieve(proxy_factory):
    proxy = proxy_factory()

    async def go():
        async with proxy.sdk() as c:
            found = await c.models.retrieve("gpt-4.1")
            with pytest.raises(openai.NotFoundError):
                await c.models.retrieve("no-such-model")
            return found

    assert proxy.run(go()).id == "gpt-4.1"


def test_cors_preflight_and_headers_only_for_configured_origins(proxy_factory):
    proxy = proxy_factory()

    async def go():
        async with proxy.http() as c:
            pre = await c.options(
                "/v1/chat/completions",
                headers={"origin": ORIGIN, "access-control-request-method": "POST",
                         "access-control-request-headers": "authorization, content-type"},
            )  # fmt: skip
            other = await c.options("/v1/chat/completions", headers={"origin": "https://evil.example"})
            models = await c.get("/v1/models", headers={"origin": ORIGIN})
            return pre, other, models

    pre, other, models = proxy.run(go())
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert pre.headers["access-control-allow-headers"] == "authorization, content-type"
    assert "access-control-allow-origin" not in other.headers
    assert models.headers["access-control-allow-origin"] == ORIGIN
    assert "x-gateway-provider" in models.headers["access-control-expose-headers"]


def test_the_library_stream_gives_text_sdk_chunks_and_the_assembled_tool_calls(proxy_factory, up):
    proxy = proxy_factory()
    calls = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    events = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": "Let me check. "}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [calls]}}]),
        chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        chunk([], usage={"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}),
    ]
    up.script(sse_fault(events), sse_fault(events), provider="direct")
    client = proxy.gateway.client
    stream = client.chat([{"role": "user", "content": "weather?"}], "gpt-4.1", stream=True, tools=[{"type": "x"}])
    assert "".join(stream) == "Let me check. "
    result = stream.result
    assert [(t.id, t.function.name, t.function.arguments) for t in result.tool_calls] == [
        ("call_7", "get_weather", '{"city": "Paris"}')
    ]
    assert result.finish_reason == "tool_calls" and result.usage.completion_tokens == 5
    chunks = list(client.chat([{"role": "user", "content": "again"}], "gpt-4.1", stream=True).chunks())
    assert [type(c).__name__ for c in chunks] == ["ChatCompletionChunk"] * 5
    assert chunks[2].choices[0].delta.tool_calls[0].function.arguments == '{"city": "Paris"}'


# ------------------------------------------------------------------ the Responses API on chat providers
CHAT_ONLY = 'apis = ["chat", "embeddings"]\n'


def test_responses_on_a_chat_only_provider_are_translated_both_ways(proxy_factory, up):
    proxy = proxy_factory(direct=CHAT_ONLY, holysheep=CHAT_ONLY)
    up.script(json_fault(ANSWER), provider="direct")
    body = {
        "model": "gpt-4.1",
        "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "weather?"}]}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 64,
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        "temperature": 0.3,
    }

    async def go():
        async with proxy.sdk() as c:
            return await c.responses.create(**body)

    got = proxy.run(go())
    sent = up.requests_for("direct")[0]
    assert sent.path == "/direct/v1/chat/completions"
    function = {"name": "get_weather", "parameters": {"type": "object"}, "strict": True}
    assert sent.json == {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        ],
        "temperature": 0.3,
        "tools": [{"type": "function", "function": function}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_completion_tokens": 64,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
        },
    }
    calls = [o for o in got.output if o.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [("call_1", "get_weather", '{"c":1}')]
    assert (
        got.status == "completed"
        and got.usage.output_tokens == 20
        and got.usage.output_tokens_details.reasoning_tokens == 8
    )
    (row,) = proxy.rows()
    assert (row["api"], row["tool_calls"], row["finish_reason"]) == ("responses", 1, "completed")


def test_a_bridged_stream_becomes_the_responses_events(proxy_factory, up):
    proxy = proxy_factory(direct=CHAT_ONLY, holysheep=CHAT_ONLY)
    events = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        chunk([{"index": 0, "delta": {"content": "Hel"}}]),
        chunk([{"index": 0, "delta": {"content": "lo"}}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        chunk([], usage={"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}),
    ]
    up.script(sse_fault(events), provider="direct")

    async def go():
        async with proxy.sdk() as c:
            stream = await c.responses.create(model="gpt-4.1", input="hi", stream=True)
            return [e async for e in stream]

    got = proxy.run(go())
    kinds = [e.type for e in got]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in got if e.type == "response.output_text.delta") == "Hello"
    assert [e.sequence_number for e in got] == list(range(len(got)))
    final = got[-1].response
    assert final.output_text == "Hello" and final.usage.input_tokens == 4 and final.model == "gpt-4.1"
    assert up.requests_for("direct")[0].json["stream_options"] == {"include_usage": True}


def test_what_chat_cannot_express_is_refused_by_name_before_any_call(proxy_factory, up):
    proxy = proxy_factory(direct=CHAT_ONLY, holysheep=CHAT_ONLY)
    r = post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "hi", "previous_response_id": "resp_x"})
    assert r.status_code == 400 and "previous_response_id" in r.json()["error"]["message"]
    r = post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "hi", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400 and "web_search" in r.json()["error"]["message"]
    assert up.requests == []


def test_what_the_bridge_cannot_carry_is_a_400_naming_the_field(proxy_factory, up):
    proxy = proxy_factory(direct=CHAT_ONLY, holysheep=CHAT_ONLY)
    for field, value in (("include", ["something.new"]), ("background", True), ("max_tool_calls", 2)):
        r = post(proxy, "/v1/responses", {"model": "gpt-4.1", "input": "hi", field: value})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and field in error["message"] and error["type"] == "invalid_request_error"
    assert up.requests == []


def test_a_bridged_refusal_reaches_the_caller_and_the_log_as_a_refusal(proxy_factory, up):
    proxy = proxy_factory(direct=CHAT_ONLY, holysheep=CHAT_ONLY)
    message = {"role": "assistant", "content": None, "refusal": "No."}
    refused = {**ANSWER, "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": message}]}
    up.script(json_fault(refused), provider="direct")
    events = [
        chunk([{"index": 0, "delta": {"role": "assistant", "content": None, "refusal": ""}}]),
        chunk([{"index": 0, "delta": {"refusal": "No."}}]),
        chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        chunk([], usage={"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}),
    ]
    up.script(sse_fault(events), provider="direct")

    async def go():
        async with proxy.sdk() as c:
            plain = await c.responses.create(model="gpt-4.1", input="hi", tools=[], parallel_tool_calls=True)
            stream = await c.responses.create(model="gpt-4.1", input="hi", stream=True)
            return plain, [e async for e in stream]

    plain, streamed = proxy.run(go())
    assert plain.output[0].content[0].type == "refusal" and plain.output[0].content[0].refusal == "No."
    assert [e.delta for e in streamed if e.type == "response.refusal.delta"] == ["No."]
    assert streamed[-1].response.output[0].content[0].refusal == "No."
    assert "tools" not in up.requests[0].json and "parallel_tool_calls" not in up.requests[0].json
    rows = proxy.rows()
    assert [(r["api"], r["status"], r["finish_reason"], r["stream"]) for r in rows] == [
        ("responses", "ok", "refusal", False),
        ("responses", "ok", "refusal", True),
    ]


def test_text_that_is_not_valid_unicode_is_repaired_wherever_it_is_in_the_body(proxy_factory, up):
    proxy = proxy_factory()

    async def go(path: str, raw: bytes) -> httpx2.Response:
        async with proxy.http() as c:
            return await c.post(path, content=raw, headers={"content-type": "application/json"})

    chat = b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "x"}], "metadata": {"\\udcffk": "\\ud800"}}'
    assert proxy.run(go("/v1/chat/completions", chat)).status_code == 200
    up.script(json_fault(RESPONSE), provider="direct")
    assert proxy.run(go("/v1/responses", b'{"model": "gpt-4.1", "input": ["a", "\\udcff"]}')).status_code == 400
    assert proxy.run(go("/v1/responses", b'{"model": "gpt-4.1", "input": "bad \\udcff"}')).status_code == 200
    sent = [q.json for q in up.requests]
    assert sent[0]["metadata"] == {"\ufffdk": "\ufffd"}
    assert sent[1]["input"] == "bad \ufffd"  # (the list of bare strings is not valid Responses input: 400)


# -- refusals logged -------------------------------------------------------------------------------
# Every request is in the log exactly once, whatever ends it (issue 17): refused by its key (none,
# unknown, a model it may not use), by its rate limit or its budget in the server, or answered. The
# whole server (build_server: auth, admission, handler, metrics) in one process over ASGI, on a
# scripted loopback upstream; what the callers saw is compared with the log.


HI = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def server(tmp_path: Path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gw.toml"
        cfg.write_text(chaos_config(up.url))
        env = {"CHAOS_KEY": "k", "DATABASE_URL": f"sqlite:///{tmp_path / 'gw.sqlite'}"}
        gw = build_gateway(load_settings(cfg, env=env), env=env, stop=threading.Event(), guardrail=False)
        srv = build_server(gw)
        loop = asyncio.new_event_loop()
        try:
            yield srv, loop
        finally:
            loop.run_until_complete(srv.handler.aclose())
            loop.close()
            gw.close()


def call(srv, loop, token: str | None, body: dict) -> int:
    async def go() -> int:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        transport = httpx2.ASGITransport(app=srv.app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as c:
            return (await c.post("/v1/chat/completions", json=body, headers=headers)).status_code

    return loop.run_until_complete(go())


def test_what_callers_saw_is_what_the_log_holds(server):
    srv, loop = server
    engine = srv.gateway.engine
    _, ok_key = create_key(engine, "ok")
    _, narrow = create_key(engine, "narrow", models=["gemini-2.5-flash"])
    _, limited = create_key(engine, "limited", rpm=1)
    _, broke = create_key(engine, "broke", budget_usd=0.000001, period="day")
    seen = [
        call(srv, loop, None, HI),  # no key
        call(srv, loop, "gw-not-a-key", HI),  # unknown key
        call(srv, loop, narrow, HI),  # a model the key may not use
        call(srv, loop, limited, HI),  # its one request this minute
        call(srv, loop, limited, HI),  # over its rate limit
        call(srv, loop, broke, {**HI, "max_tokens": 100_000}),  # over its budget
        call(srv, loop, ok_key, HI),
    ]
    assert seen == [401, 401, 403, 200, 429, 429, 200]
    srv.gateway.client.flush()
    with engine.connect() as conn:
        rows = conn.execute(text("select provider, status, http_status, error_class, key_name, final from request_log"))
        rows = [tuple(r) for r in rows]
    assert len(rows) == len(seen) and all(r[5] for r in rows)  # one final row per request
    assert Counter(r[2] for r in rows) == Counter(seen)
    refused = sorted((r[3], r[4]) for r in rows if r[0] == "gateway")
    assert refused == [
        ("budget_exceeded", "broke"),
        ("gateway_rate_limited", "limited"),
        ("key_refused", None),
        ("key_refused", None),
        ("model_not_allowed", "narrow"),
    ]
