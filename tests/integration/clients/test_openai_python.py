"""openai-python (the official SDK, sync and async) against the gateway as a transparent OpenAI proxy:
what the client sends reaches the upstream as sent (every parameter, unknown fields, every message
shape), what the upstream answers reaches the client whole (choices, tool calls, refusal, logprobs,
usage details, fingerprint, service tier; only ``model`` is the routed one), streams chunk by chunk,
errors with the upstream's status and error object, headers passed through. Every body and SSE event
the client read is validated against the official OpenAI OpenAPI schema.

Each test runs against ``target`` "gateway" (CI) and, to prove the test itself, "upstream" (the
scripted upstream directly): see tests/integration/clients/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.integration.clients.expect import MODEL, SNAPSHOT, answer_model, forwarded, renamed
from tests.support.chaos_upstream import (
    bad_request,
    chat_body,
    chat_chunk,
    choice,
    embeddings_body,
    error,
    function_call_item,
    interleaved_chunks,
    logprobs_body,
    message_item,
    model_body,
    models_body,
    rate_limited,
    refusal_body,
    reply,
    response_body,
    response_events,
    sse,
    text_chunks,
    text_completion_body,
    tool_call,
    tool_call_body,
    tool_call_chunks,
    usage,
)
from tests.support.serve_process import UPSTREAM_KEY

HELLO = [{"role": "user", "content": "hello"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
RATE_HEADERS = {
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-limit-tokens": "30000000",
    "x-ratelimit-remaining-tokens": "29999950",
    "x-ratelimit-reset-tokens": "0s",
    "openai-processing-ms": "187",
}


def data_events(target) -> list:
    """The JSON data of every SSE event of the last exchange (``[DONE]`` dropped)."""
    return [d for _, d in target.tap.last.events if d != "[DONE]"]


# ------------------------------------------------------------------------------------------ plain chat


def test_sync_chat_body_forwarded_and_answer_whole(target):
    body = chat_body(SNAPSHOT, usage_=usage(20, 9, cached=4, reasoning=3))
    target.script(reply(body))
    client = target.openai()
    r = client.chat.completions.create(model=MODEL, messages=HELLO, temperature=0.2)
    assert r.choices[0].message.content == body["choices"][0]["message"]["content"]
    assert r.model == answer_model(target)
    assert r.usage.prompt_tokens_details.cached_tokens == 4
    assert r.usage.completion_tokens_details.reasoning_tokens == 3
    assert r.system_fingerprint == body["system_fingerprint"] and r.service_tier == "default"
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    assert target.tap.last.json() == renamed(body, answer_model(target))
    assert target.validate_all() == 1


def test_async_chat_concurrent(target):
    async def main():
        client = target.async_openai()
        try:
            questions = [f"question {i}" for i in range(4)]
            calls = [
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}])
                for q in questions
            ]
            return questions, await asyncio.gather(*calls)
        finally:
            await client.close()

    questions, answers = asyncio.run(main())
    assert [a.choices[0].message.content for a in answers] == ["Hello from the scripted upstream."] * 4
    assert sorted(r.json["messages"][0]["content"] for r in target.received) == questions
    assert target.validate_all() == 4


def test_answer_model_is_routed_others_untouched(target):
    """The upstream names a dated snapshot; through the gateway the client sees the routed model."""
    target.script(reply(chat_body(SNAPSHOT)))
    raw = target.openai().chat.completions.with_raw_response.create(model=MODEL, messages=HELLO)
    assert raw.parse().model == answer_model(target)
    assert target.validate_all() == 1


ANSWERS = {
    "tool_calls": tool_call_body(
        SNAPSHOT,
        [
            tool_call("call_a1", "get_weather", {"city": "Paris", "unit": "c"}),
            tool_call("call_b2", "get_weather", {"city": "Oslo", "unit": "c"}),
        ],
    ),
    "refusal": refusal_body(SNAPSHOT),
    "logprobs": logprobs_body(SNAPSHOT),
    "n2": chat_body(SNAPSHOT, [choice(0, content="first"), choice(1, content="second", finish_reason="length")]),
    "reasoning_usage": chat_body(SNAPSHOT, usage_=usage(30, 200, cached=16, reasoning=128, accepted_prediction=2)),
    "annotations": chat_body(
        SNAPSHOT,
        [
            choice(
                annotations=[
                    {
                        "type": "url_citation",
                        "url_citation": {
                            "url": "https://example.com/a",
                            "title": "A",
                            "start_index": 0,
                            "end_index": 5,
                        },
                    }
                ]
            )
        ],
        service_tier="flex",
    ),
}


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_upstream_answer_reaches_client_whole(target, kind):
    body = ANSWERS[kind]
    target.script(reply(body))
    r = target.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert target.tap.last.json() == renamed(body, answer_model(target))
    # ...and the SDK reads the same thing out of it: every field, none lost or added.
    assert r.model_dump(exclude_unset=True) == renamed(body, answer_model(target))
    assert target.validate_all() == 1


# ------------------------------------------------------------------------------------------- streams


def test_stream_chunk_by_chunk_usage_withheld_when_not_asked(target):
    chunks = text_chunks(SNAPSHOT, "one two three four")
    target.script(sse(chunks))
    stream = target.openai().chat.completions.create(model=MODEL, messages=HELLO, stream=True)
    texts = [c.choices[0].delta.content for c in stream if c.choices]
    assert "".join(t or "" for t in texts) == "one two three four"
    got = data_events(target)
    want = [renamed(c, answer_model(target)) for c in chunks if c["choices"]]  # no usage chunk: not asked
    assert got == want
    assert target.tap.last.events[-1] == (None, "[DONE]")
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    if target.is_gateway:
        assert target.last.json["stream_options"]["include_usage"] is True
    assert target.validate_all() == len(want)


def test_stream_reaches_client_while_upstream_still_answering(target):
    """Chunk by chunk, not buffered: the first two events reach the client while the upstream holds
    the rest back (until the client has them)."""
    release = threading.Event()
    chunks = text_chunks(SNAPSHOT, "first second third")
    target.script(sse(chunks, hold_after=2, release=release))
    stream = iter(target.openai().chat.completions.create(model=MODEL, messages=HELLO, stream=True))
    head = [next(stream), next(stream)]
    still_answering = not target.last.served.is_set()
    release.set()
    rest = list(stream)
    assert still_answering
    assert [c.choices[0].delta.content for c in head] == ["", "first"]
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == " second third"
    assert target.validate_all() == len(chunks) - 1


def test_stream_usage_chunk_when_asked(target):
    chunks = text_chunks(SNAPSHOT, "with usage", usage_=usage(9, 2, reasoning=1))
    target.script(sse(chunks))
    stream = target.openai().chat.completions.create(
        model=MODEL, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    last = list(stream)[-1]
    assert last.choices == [] and last.usage.completion_tokens_details.reasoning_tokens == 1
    assert data_events(target) == [renamed(c, answer_model(target)) for c in chunks]
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() == len(chunks)


def test_stream_tool_call_deltas_unmerged(target):
    calls = [
        tool_call("call_s1", "get_weather", {"city": "Paris", "unit": "c"}),
        tool_call("call_s2", "get_weather", {"city": "Lima", "unit": "f"}),
    ]
    chunks = tool_call_chunks(SNAPSHOT, calls, fragments=4)
    target.script(sse(chunks))
    stream = target.openai().chat.completions.create(
        model=MODEL, messages=HELLO, tools=[WEATHER_TOOL], stream=True, stream_options={"include_usage": True}
    )
    args: dict[int, str] = {}
    heads: dict[int, tuple] = {}
    for c in stream:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.id:
                heads[d.index] = (d.id, d.function.name)
            args[d.index] = args.get(d.index, "") + (d.function.arguments or "")
    assert heads == {0: ("call_s1", "get_weather"), 1: ("call_s2", "get_weather")}
    assert [json.loads(args[i]) for i in (0, 1)] == [json.loads(c["function"]["arguments"]) for c in calls]
    assert data_events(target) == [renamed(c, answer_model(target)) for c in chunks]
    assert target.validate_all() == len(chunks)


def test_stream_n2_interleaved_in_order(target):
    chunks = interleaved_chunks(SNAPSHOT, ["alpha beta gamma", "delta epsilon"])
    target.script(sse(chunks))
    stream = target.openai().chat.completions.create(model=MODEL, messages=HELLO, n=2, stream=True)
    texts = {0: "", 1: ""}
    order = []
    for c in stream:
        for ch in c.choices:
            order.append(ch.index)
            texts[ch.index] += ch.delta.content or ""
    assert texts == {0: "alpha beta gamma", 1: "delta epsilon"}
    assert order == [c["choices"][0]["index"] for c in chunks if c["choices"]]
    assert data_events(target) == [renamed(c, answer_model(target)) for c in chunks if c["choices"]]
    assert target.last.json["n"] == 2
    assert target.validate_all() == len(order)


# --------------------------------------------------------------------------------- tool round trips


def _weather_result(call) -> dict:
    return {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18, "sky": "clear"})}


def test_tool_round_trip(target):
    calls = [tool_call("call_rt1", "get_weather", {"city": "Paris", "unit": "c"})]
    target.script(reply(tool_call_body(SNAPSHOT, calls)), reply(chat_body(SNAPSHOT, [choice(content="18C and clear")])))
    client = target.openai()
    first = client.chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL], tool_choice="auto")
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and msg.content is None
    call = msg.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "call_rt1",
        "get_weather",
        {"city": "Paris", "unit": "c"},
    )
    assistant = {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]}
    second = client.chat.completions.create(
        model=MODEL, messages=[*HELLO, assistant, _weather_result(call)], tools=[WEATHER_TOOL]
    )
    assert second.choices[0].message.content == "18C and clear"
    leg2 = target.received[1].json
    assert leg2["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [calls[0]]}
    assert leg2["messages"][2] == {
        "role": "tool",
        "tool_call_id": "call_rt1",
        "content": '{"temp_c": 18, "sky": "clear"}',
    }
    assert leg2 == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() == 2


def test_tool_round_trip_streamed(target):
    calls = [tool_call("call_st1", "get_weather", {"city": "Rome", "unit": "c"})]
    target.script(sse(tool_call_chunks(SNAPSHOT, calls)), sse(text_chunks(SNAPSHOT, "Sunny in Rome")))
    client = target.openai()
    args, call_id, name = "", None, None
    for c in client.chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL], stream=True):
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            call_id, name = d.id or call_id, (d.function.name if d.function and d.function.name else name)
            args += d.function.arguments or ""
    assert (call_id, name, json.loads(args)) == ("call_st1", "get_weather", {"city": "Rome", "unit": "c"})
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
    }
    tool = {"role": "tool", "tool_call_id": call_id, "content": "sunny"}
    stream = client.chat.completions.create(model=MODEL, messages=[*HELLO, assistant, tool], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Sunny in Rome"
    leg2 = target.received[1].json
    assert leg2["messages"][1:] == [assistant, tool]
    assert leg2 == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() > 2


# ------------------------------------------------------------------------------------ message shapes


MESSAGES = [
    {"role": "developer", "content": "Answer in French."},
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}], "name": "policy"},
    {
        "role": "user",
        "name": "alice",
        "content": [
            {"type": "text", "text": "What is in these?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}},
            {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "name": "bot",
        "tool_calls": [{"id": "call_m1", "type": "function", "function": {"name": "look", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "call_m1", "content": [{"type": "text", "text": "a cat"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Un chat."}]},
    {"role": "user", "content": "Merci \u00e9\u00e8 \U0001f600"},
]


def test_every_message_shape_reaches_upstream_as_sent(target):
    target.openai().chat.completions.create(model=MODEL, messages=MESSAGES)
    assert target.last.json["messages"] == MESSAGES
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() == 1


# ----------------------------------------------------------------------------- structured outputs


class CityWeather(BaseModel):
    city: str
    temp_c: float
    conditions: list[str]


def test_parse_with_pydantic_response_format(target):
    content = json.dumps({"city": "Paris", "temp_c": 18.5, "conditions": ["clear", "windy"]})
    target.script(reply(chat_body(SNAPSHOT, [choice(content=content)])))
    r = target.openai().chat.completions.parse(model=MODEL, messages=HELLO, response_format=CityWeather)
    assert r.choices[0].message.parsed == CityWeather(city="Paris", temp_c=18.5, conditions=["clear", "windy"])
    fmt = target.last.json["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["name"] == "CityWeather"
    assert set(fmt["json_schema"]["schema"]["properties"]) == {"city", "temp_c", "conditions"}
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() == 1


class GetWeather(BaseModel):
    city: str
    unit: str


def test_stream_helper_with_pydantic_tool(target):
    calls = [tool_call("call_h1", "GetWeather", {"city": "Bern", "unit": "c"})]
    target.script(sse(tool_call_chunks(SNAPSHOT, calls, fragments=5)))
    client = target.openai()
    with client.chat.completions.stream(
        model=MODEL, messages=HELLO, tools=[openai.pydantic_function_tool(GetWeather)]
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds and "tool_calls.function.arguments.done" in kinds
    parsed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    assert parsed == GetWeather(city="Bern", unit="c")
    sent_tool = target.last.json["tools"][0]
    assert sent_tool["function"]["name"] == "GetWeather" and sent_tool["function"]["strict"] is True
    assert target.last.json == forwarded(target, target.tap.last.sent_json)
    assert target.validate_all() > 3


# ---------------------------------------------------------------------------- every parameter passes

TOOLS = [WEATHER_TOOL]
JSON_SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "why": {"type": ["string", "null"]}},
            "required": ["n", "why"],
            "additionalProperties": False,
        },
    },
}
# One case per parameter: the keyword arguments the client sends (each value must reach the upstream
# byte-equal: same JSON, same key order).
PARAMETERS: dict[str, dict[str, Any]] = {
    "tools": {"tools": TOOLS},
    "tool_choice_named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "tool_choice_required": {"tools": TOOLS, "tool_choice": "required"},
    "parallel_tool_calls": {"tools": TOOLS, "parallel_tool_calls": False},
    "response_format_json_object": {"response_format": {"type": "json_object"}},
    "response_format_json_schema_strict": {"response_format": JSON_SCHEMA_FORMAT},
    "stop": {"stop": ["\n\n", "END"]},
    "seed": {"seed": 1234567},
    "temperature": {"temperature": 0.0},
    "top_p": {"top_p": 0.25},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": -0.75},
    "logit_bias": {"logit_bias": {"50256": -100, "1734": 5}},
    "logprobs_top_logprobs": {"logprobs": True, "top_logprobs": 3},
    "reasoning_effort": {"reasoning_effort": "low"},
    "verbosity": {"verbosity": "high"},
    "user": {"user": "user-1234"},
    "store": {"store": True},
    "metadata": {"store": True, "metadata": {"team": "search", "run": "42"}},
    "service_tier": {"service_tier": "flex"},
    "prediction": {"prediction": {"type": "content", "content": "def f():\n    return 1\n"}},
    "modalities_audio": {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
    "web_search_options": {
        "web_search_options": {
            "search_context_size": "low",
            "user_location": {"type": "approximate", "approximate": {"country": "FR", "city": "Paris"}},
        }
    },
    "safety_identifier": {"safety_identifier": "3f1e9c"},
    "prompt_cache_key": {"prompt_cache_key": "tenant-7/session-9"},
    "max_completion_tokens": {"max_completion_tokens": 77},
    "max_tokens_legacy": {"max_tokens": 55},
    "n": {"n": 2},
    "stream_include_obfuscation": {"stream": True, "stream_options": {"include_obfuscation": False}},
    "unknown_fields": {"extra_body": {"x_vendor_option": {"nested": [1, 2.5, None, "\u00e9"]}, "top_k": 40}},
}


@pytest.mark.parametrize("case", sorted(PARAMETERS))
def test_parameter_reaches_upstream_unchanged(target, case):
    kwargs = dict(PARAMETERS[case])
    client = target.openai()
    r = client.chat.completions.create(model=MODEL, messages=HELLO, **kwargs)
    if kwargs.get("stream"):
        list(r)
    sent = target.tap.last.sent_json
    got = target.last.json
    sent_params = {**kwargs.pop("extra_body", {}), **kwargs}
    for name, value in sent_params.items():
        if name == "stream_options":  # the gateway adds include_usage; the client's own keys stay as sent
            assert {k: got[name][k] for k in value} == value
            continue
        # The same JSON text: a value re-encoded on the way (0.0 -> 0, key order, escapes) fails here.
        assert json.dumps(got[name]) == json.dumps(value), name
    assert "max_tokens" not in got or case == "max_tokens_legacy"  # max_completion_tokens is not renamed
    assert got == forwarded(target, sent)
    if case == "stream_include_obfuscation":
        assert got["stream_options"]["include_obfuscation"] is False
    assert target.validate_all() >= 1


# -------------------------------------------------------------------------------------------- errors

REFUSALS = {  # status -> the upstream's error object
    400: {"message": "Invalid value for 'temperature': expected a number between 0 and 2.",
          "type": "invalid_request_error", "param": "temperature", "code": "invalid_value"},
    404: {"message": "The model `gpt-9` does not exist or you do not have access to it.",
          "type": "invalid_request_error", "param": None, "code": "model_not_found"},
    422: {"message": "Unprocessable: 'messages' must not be empty.",
          "type": "invalid_request_error", "param": "messages", "code": "invalid_messages"},
}  # fmt: skip
ERROR_TYPES = {400: openai.BadRequestError, 404: openai.NotFoundError, 422: openai.UnprocessableEntityError}


@pytest.mark.parametrize("status", sorted(REFUSALS))
def test_upstream_refusal_reaches_client_with_its_status_and_error(target, status):
    e = REFUSALS[status]
    target.script(error(status, e["message"], type_=e["type"], code=e["code"], param=e["param"]))
    with pytest.raises(ERROR_TYPES[status]) as caught:
        target.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert caught.value.status_code == status
    assert target.tap.last.json() == {"error": e}
    assert (caught.value.code, caught.value.param) == (e["code"], e["param"])
    assert len(target.received) == 1  # a refusal about the request is not retried
    assert target.validate_all() == 1


def test_refusal_echoing_a_secret_is_scrubbed(target):
    """A refusal about the request whose message quotes the upstream key (as some upstreams echo
    headers): its status and error fields reach the client, the key never does."""
    message = f"Invalid 'user': got header Bearer {UPSTREAM_KEY} for project proj_1"
    target.script(bad_request(message, code="invalid_value", param="user"))
    with pytest.raises(openai.BadRequestError) as caught:
        target.openai().chat.completions.create(model=MODEL, messages=HELLO, user="u1")
    assert caught.value.status_code == 400
    body = target.tap.last.json()
    assert (body["error"]["code"], body["error"]["param"]) == ("invalid_value", "user")
    assert body["error"]["message"].startswith("Invalid 'user'") and "for project proj_1" in body["error"]["message"]
    if target.is_gateway:  # straight from the scripted upstream the echo is there, as sent
        assert UPSTREAM_KEY not in target.tap.last.body.decode()
        assert target.api_key not in target.tap.last.body.decode()
    assert target.validate_all() == 1


def test_upstream_429_with_nothing_to_fail_over_to(target):
    target.script(rate_limited(retry_after_s=7))
    with pytest.raises(openai.RateLimitError) as caught:
        target.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "7"
    assert target.tap.last.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(target.received) == 1
    assert target.validate_all() == 1


# ------------------------------------------------------------------------------------------- headers


def test_upstream_and_gateway_headers(target):
    target.script(reply(chat_body(SNAPSHOT), headers=RATE_HEADERS))
    raw = target.openai().chat.completions.with_raw_response.create(model=MODEL, messages=HELLO)
    h = raw.headers
    assert {k: h.get(k) for k in RATE_HEADERS} == RATE_HEADERS
    if target.is_gateway:
        assert h["x-request-id"]
        assert h["x-gateway-provider"] == "direct" and h["x-gateway-model"] == MODEL
        assert h["x-gateway-intent"] == "explicit" and h["x-gateway-canary-side"] == "fallback"
        assert h["x-gateway-attempts"] == "1"
    assert target.validate_all() == 1


def test_stream_headers_passed_through(target):
    target.script(sse(text_chunks(SNAPSHOT, "hi"), headers=RATE_HEADERS))
    with target.openai().chat.completions.with_streaming_response.create(
        model=MODEL, messages=HELLO, stream=True
    ) as raw:
        assert {k: raw.headers.get(k) for k in RATE_HEADERS} == RATE_HEADERS
        chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"
    if target.is_gateway:
        assert raw.headers["x-gateway-provider"] == "direct" and raw.headers["x-request-id"]
    assert target.validate_all() >= 3


# ------------------------------------------------------------------------------------ other endpoints


def test_responses_create_plain(target):
    body = response_body(SNAPSHOT, "Bonjour.")
    target.script(reply(body, headers=RATE_HEADERS))
    raw = target.openai().responses.with_raw_response.create(
        model=MODEL, input="Say hello in French", instructions="Be brief.", max_output_tokens=50, store=False,
        metadata={"k": "v"}, reasoning={"effort": "low"}, text={"verbosity": "low"},
    )  # fmt: skip
    r = raw.parse()
    assert r.output_text == "Bonjour." and r.model == answer_model(target)
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert {k: raw.headers.get(k) for k in RATE_HEADERS} == RATE_HEADERS
    assert target.last.path.endswith("/v1/responses")
    assert target.last.json == target.tap.last.sent_json
    assert target.tap.last.json() == renamed(body, answer_model(target))
    assert target.validate_all() == 1


def test_responses_function_call_item(target):
    item = function_call_item("call_r1", "get_weather", {"city": "Kyiv", "unit": "c"})
    target.script(reply(response_body(SNAPSHOT, [item])))
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": WEATHER_TOOL["function"]["parameters"],
            "strict": True,
        }
    ]
    r = target.openai().responses.create(model=MODEL, input="weather in Kyiv?", tools=tools)
    out = r.output[0]
    assert (out.type, out.call_id, out.name, json.loads(out.arguments)) == (
        "function_call",
        "call_r1",
        "get_weather",
        {"city": "Kyiv", "unit": "c"},
    )
    assert target.last.json["tools"] == tools
    # The second leg: the call's output goes back as an input item.
    client = target.openai()
    client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "weather in Kyiv?"},
            {"type": "function_call", "call_id": "call_r1", "name": "get_weather", "arguments": out.arguments},
            {"type": "function_call_output", "call_id": "call_r1", "output": '{"temp_c": 3}'},
        ],
        tools=tools,
    )
    assert target.last.json["input"][2] == {
        "type": "function_call_output",
        "call_id": "call_r1",
        "output": '{"temp_c": 3}',
    }
    assert target.last.json == target.tap.last.sent_json
    assert target.validate_all() == 2


def test_responses_stream_semantic_events(target):
    events = response_events(SNAPSHOT, [message_item("Hola amigo"), function_call_item("call_e1", "f", {"x": 1})])
    target.script(sse(events, named=True))
    stream = target.openai().responses.create(model=MODEL, input="hi", stream=True)
    seen = list(stream)
    assert [e.type for e in seen] == [e["type"] for e in events]
    assert [e.sequence_number for e in seen] == list(range(len(events)))
    deltas = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert deltas == "Hola amigo"
    assert seen[-1].response.output[1].arguments == '{"x": 1}'
    assert [name for name, _ in target.tap.last.events] == [e["type"] for e in events]
    got = [d for _, d in target.tap.last.events]
    assert [{k: v for k, v in g.items() if k != "response"} for g in got] == [
        {k: v for k, v in e.items() if k != "response"} for e in events
    ]
    assert target.last.json == target.tap.last.sent_json
    assert target.validate_all() == len(events)


def test_embeddings_create(target):
    vectors = [[0.125, -0.5, 0.25], [1.0, 0.0, -1.0]]
    body = embeddings_body("text-embedding-3-small", vectors)
    target.script(reply(body))
    r = target.openai().embeddings.create(
        model="text-embedding-3-small", input=["a", "b"], encoding_format="float", dimensions=3, user="u1"
    )
    assert [d.embedding for d in r.data] == vectors and r.usage.prompt_tokens == 8
    assert target.last.path.endswith("/v1/embeddings")
    assert target.last.json == target.tap.last.sent_json
    sent = {"model": "text-embedding-3-small", "input": ["a", "b"], "encoding_format": "float", "dimensions": 3}
    assert target.last.json == {**sent, "user": "u1"}
    assert target.validate_all() == 1


def test_legacy_completions_create(target):
    body = text_completion_body(MODEL, ["Paris.", "Lyon."])
    target.script(reply(body))
    r = target.openai().completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=7, n=2, echo=False, stop=["\n"]
    )
    assert [c.text for c in r.choices] == ["Paris.", "Lyon."]
    assert target.last.path.endswith("/v1/completions") and not target.last.path.endswith("/chat/completions")
    assert target.last.json == target.tap.last.sent_json
    assert target.tap.last.json() == body
    assert target.validate_all() == 1


def test_models_retrieve_and_list(target):
    target.script(reply(model_body(MODEL)), reply(models_body(["gpt-4.1", "text-embedding-3-small"])))
    client = target.openai()
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"
    ids = [x.id for x in client.models.list()]
    assert {"gpt-4.1", "text-embedding-3-small"} <= set(ids)
    assert [ex.path.rsplit("/v1", 1)[1] for ex in target.tap.exchanges] == [f"/models/{MODEL}", "/models"]
    assert target.validate_all() == 2


def test_models_retrieve_unknown_is_404(target):
    target.script(
        error(404, "The model 'nope-1' does not exist", type_="invalid_request_error", code="model_not_found")
    )
    with pytest.raises(openai.NotFoundError):
        target.openai().models.retrieve("nope-1")
    assert target.tap.last.status == 404
    assert target.validate_all() == 1


def test_stream_refusal_delta(target):
    """A refusal streamed as a delta (hand-made chunks) reaches the client as sent."""
    chunks = [
        chat_chunk(
            SNAPSHOT,
            [{"index": 0, "delta": {"role": "assistant", "refusal": "No."}, "logprobs": None, "finish_reason": None}],
        ),
        chat_chunk(SNAPSHOT, [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]),
    ]
    target.script(sse(chunks))
    got = list(target.openai().chat.completions.create(model=MODEL, messages=HELLO, stream=True))
    assert got[0].choices[0].delta.refusal == "No." and got[1].choices[0].finish_reason == "stop"
    assert target.validate_all() == 2
