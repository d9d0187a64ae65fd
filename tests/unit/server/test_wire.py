"""OpenAI wire format (app/server/wire.py): what we produce is what the openai SDK parses, and bad
requests get OpenAI-style 400/413 errors."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.server import wire
from tests.support import wire_bodies as bodies

HELLO = [{"role": "user", "content": "hi"}]


def sse_payloads(raw: bytes) -> list[str]:
    events = raw.decode().split("\n\n")
    assert events[-1] == ""
    assert all(e.startswith("data: ") for e in events[:-1])
    return [e.removeprefix("data: ") for e in events[:-1]]


def test_completion_body_parses_as_sdk_model():
    args = {
        "completion_id": "chatcmpl-abc",
        "created": 1_700_000_000,
        "model": "gpt-4.1",
        "content": "héllo",
        "usage": bodies.usage_dict(12, 5, cached_tokens=8),
    }
    raw = bodies.completion_json(**args)
    assert json.loads(raw) == bodies.completion_body(**args)
    c = ChatCompletion.model_validate(json.loads(raw))
    assert c.id == "chatcmpl-abc" and c.object == "chat.completion" and c.model == "gpt-4.1"
    assert c.created == 1_700_000_000
    assert c.choices[0].message.content == "héllo" and c.choices[0].finish_reason == "stop"
    assert c.choices[0].message.role == "assistant"
    u = c.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens, u.prompt_tokens_details.cached_tokens) == (
        12,
        5,
        17,
        8,
    )


def test_stream_chunks_parse_and_include_usage_semantics():
    raw = b"".join(
        bodies.sse_events(
            ["Hel", "lo"],
            completion_id="chatcmpl-s",
            created=5,
            model="m",
            include_usage=True,
            usage=bodies.usage_dict(3, 2, 1),
        )
    )
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(p) for p in payloads[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, None, "stop"]
    assert all(c.object == "chat.completion.chunk" and c.id == "chatcmpl-s" for c in chunks)
    # include_usage: every chunk has "usage": null except the last, which has empty choices.
    assert all(json.loads(p)["usage"] is None for p in payloads[:-2])
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 1

    plain = sse_payloads(
        b"".join(
            bodies.sse_events(
                ["x"], completion_id="c", created=5, model="m", include_usage=False, usage=bodies.usage_dict(3, 2)
            )
        )
    )
    assert all("usage" not in json.loads(p) for p in plain[:-1])
    assert len(plain) == 4  # role, content, finish, [DONE]: no usage chunk


def sdk_over(handler) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://gw.test/v1",
        api_key="gw-x",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def test_the_sdk_itself_reads_our_bodies_and_streams():
    def handler(request: httpx2.Request) -> httpx2.Response:
        req = wire.parse_chat_request(request.content)
        usage = bodies.usage_dict(4, 2, 0)
        if req.stream:
            body = b"".join(
                bodies.sse_events(
                    ["a", "b"],
                    completion_id="c1",
                    created=1,
                    model=req.model,
                    include_usage=req.include_usage,
                    usage=usage,
                )
            )
            return httpx2.Response(200, content=body, headers={"content-type": wire.SSE_CONTENT_TYPE})
        body = bodies.completion_json(completion_id="c1", created=1, model=req.model, content="ab", usage=usage)
        return httpx2.Response(200, content=body, headers={"content-type": wire.JSON_CONTENT_TYPE})

    with sdk_over(handler) as client:
        r = client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        assert r.choices[0].message.content == "ab" and r.usage.total_tokens == 6
        chunks = list(
            client.chat.completions.create(
                model="gpt-4.1", messages=HELLO, stream=True, stream_options={"include_usage": True}
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ab"
        assert chunks[-1].usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("error", "sdk_class", "status"),
    [
        (wire.bad_request("bad", param="model"), openai.BadRequestError, 400),
        (wire.unauthorized(), openai.AuthenticationError, 401),
        (wire.model_not_allowed("gpt-4.1"), openai.PermissionDeniedError, 403),
        (wire.model_not_found("nope"), openai.NotFoundError, 404),
        (wire.body_too_large(10), openai.APIStatusError, 413),
        (wire.rate_limited("slow down", 7), openai.RateLimitError, 429),
        (wire.budget_exceeded("used up"), openai.RateLimitError, 429),
        (wire.upstream_failed(), openai.InternalServerError, 502),
        (wire.unavailable(), openai.InternalServerError, 503),
        (wire.upstream_timeout(), openai.InternalServerError, 504),
    ],
)
def test_error_objects_map_to_the_sdk_exceptions(error, sdk_class, status):
    def handler(request):
        return httpx2.Response(
            error.status, content=error.to_json(), headers={"content-type": "application/json", **error.headers}
        )

    with sdk_over(handler) as client, pytest.raises(sdk_class) as info:
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert info.value.status_code == status
    assert info.value.body == error.body()["error"]  # the SDK unwraps {"error": {...}}
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_rate_limit_and_budget_codes_and_headers():
    rl = wire.rate_limited("x", 0)
    assert rl.headers["Retry-After"] == "1" and rl.code == "rate_limit_exceeded" and rl.type == "requests"
    assert wire.rate_limited("x", 12, tokens=True).code == "tokens_limit_exceeded"
    b = wire.budget_exceeded("x")
    assert (b.status, b.code, b.type) == (
        429,
        "budget_exceeded",
        "insufficient_quota",
    ) and "Retry-After" not in b.headers
    assert wire.unauthorized().headers["WWW-Authenticate"] == "Bearer"


def test_error_mid_stream_is_raised_by_the_sdk():
    def handler(request):
        enc = bodies.ChunkStream(completion_id="c", created=1, model="m", include_usage=False)
        body = enc.role() + enc.content("par") + wire.upstream_failed("provider dropped the stream").to_sse()
        return httpx2.Response(200, content=body, headers={"content-type": wire.SSE_CONTENT_TYPE})

    with sdk_over(handler) as client, pytest.raises(openai.APIError, match="provider dropped the stream"):
        list(client.chat.completions.create(model="m", messages=HELLO, stream=True))


# ------------------------------------------------------------------------------------ validation


def test_valid_request_fields():
    body = {
        "model": "auto",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": []},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 64,
        "temperature": 0,
        "top_p": 1,
        "stop": "END",
        "seed": -3,
        "user": "u1",
        "logit_bias": {},
    }
    r = wire.parse_chat_request(json.dumps(body).encode())
    assert (r.model, r.stream, r.include_usage, r.max_tokens, r.temperature, r.stop, r.seed, r.user) == (
        "auto",
        True,
        True,
        64,
        0.0,
        ["END"],
        -3,
        "u1",
    )
    assert r.body["logit_bias"] == {} and len(r.messages) == 3


@pytest.mark.parametrize(
    ("raw", "param", "message"),
    [
        (b"", None, "empty"),
        (b"{not json", None, "could not parse"),
        (b"\xff\xfe", None, "UTF-8"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"model": "m", "messages": [], "temperature": NaN}', None, "NaN is not valid JSON"),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "temperature": 1e400}',
            "temperature",
            "between 0 and 2",
        ),
        (b"[" * 100_000 + b"]" * 100_000, None, "nested too deeply"),
        (b'{"messages": [{"role":"user","content":"x"}]}', "model", "'model' is required"),
        (b'{"model": 5, "messages": [{"role":"user","content":"x"}]}', "model", "'model' is required"),
        (b'{"model": "m"}', "messages", "'messages' is required"),
        (b'{"model": "m", "messages": "hi"}', "messages", "non-empty array"),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]", "must be an object"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role", "must be one of"),
        (b'{"model": "m", "messages": [{"role": "user"}]}', "messages[0].content", "is required"),
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content", "string or a list"),
        (
            b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}',
            "messages[0].content[0].text",
            "string",
        ),
        (b'{"model": "m", "messages": [{"role":"user","content":"x"}], "stream": "yes"}', "stream", "true or false"),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "stream_options": {"include_usage": true}}',
            "stream_options",
            "only allowed when 'stream'",
        ),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "stream": true, '
            b'"stream_options": {"include_usage": 1}}',
            "stream_options.include_usage",
            "true or false",
        ),
        (b'{"model": "m", "messages": [{"role":"user","content":"x"}], "max_tokens": 0}', "max_tokens", "whole number"),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "max_tokens": 1.5}',
            "max_tokens",
            "whole number",
        ),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "max_tokens": true}',
            "max_tokens",
            "whole number",
        ),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "max_tokens": 1' + b"0" * 500 + b"}",
            "max_tokens",
            "a huge number",
        ),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "max_tokens": 5, "max_completion_tokens": 5}',
            "max_tokens",
            "not both",
        ),
        (b'{"model": "m", "messages": [{"role":"user","content":"x"}], "top_p": 1.5}', "top_p", "between 0 and 1"),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "presence_penalty": -3}',
            "presence_penalty",
            "between -2 and 2",
        ),
        (
            b'{"model": "m", "messages": [{"role":"user","content":"x"}], "stop": ["a","b","c","d","e"]}',
            "stop",
            "up to 4",
        ),
        (b'{"model": "m", "messages": [{"role":"user","content":"x"}], "user": 7}', "user", "at most 256"),
    ],
)
def test_invalid_requests_get_400_with_param(raw, param, message):
    with pytest.raises(wire.WireError) as info:
        wire.parse_chat_request(raw)
    err = info.value
    assert err.status == 400 and err.type == "invalid_request_error" and err.param == param
    assert message in err.message
    assert json.loads(err.to_json())["error"]["param"] == param


def test_body_size_limit_is_413():
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}).encode()
    with pytest.raises(wire.WireError) as info:
        wire.parse_chat_request(raw, max_body_bytes=1000)
    assert info.value.status == 413 and info.value.code == "request_too_large" and "1,000 bytes" in info.value.message
    assert wire.parse_chat_request(raw, max_body_bytes=len(raw)).model == "m"


def test_n_choices_and_unknown_fields_are_the_upstreams_to_judge():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3, "brand_new_field": {"a": [1]}}
    req = wire.validate_chat_request(body)
    assert req.body["n"] == 3 and req.body["brand_new_field"] == {"a": [1]}


def test_a_gateway_error_body_is_encoded_once_and_the_kept_bodies_stay_bounded():
    first, again = wire.overloaded(8), wire.overloaded(8)
    assert first.to_json() is again.to_json()  # a flood of refusals encodes its body once
    assert (
        json.loads(wire.overloaded(9).to_json())["error"]["message"] != json.loads(first.to_json())["error"]["message"]
    )
    for i in range(600):
        assert json.loads(wire.bad_request(f"bad {i}", param="p").to_json())["error"] == {
            "message": f"bad {i}",
            "type": "invalid_request_error",
            "param": "p",
            "code": None,
        }
    assert len(wire._ERROR_BODIES) <= 256
    upstream = wire.WireError(400, "x", upstream={"error": {"message": "the upstream's own"}})
    assert json.loads(upstream.to_json()) == {"error": {"message": "the upstream's own"}}
