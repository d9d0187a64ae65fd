"""Chat completions of the simulator through the real openai SDK over the mock transport: tools and
tool_choice, the tool round trip, streamed tool-call deltas, structured output, logprobs, n
choices, stop/length, reasoning tokens, usage details, headers, and OpenAI-shaped refusals."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Literal

import httpx2
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from app.simulator import SimulatedProvider, make_transport
from app.simulator.tokens import tokenize

MODELS = ["gpt-4.1", "deepseek-chat-v3.2"]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string"}, "formats": {"type": "array", "items": {"type": "string"}}},
    "required": ["timezone"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather for a city", "parameters": WEATHER_PARAMS},
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "description": "The local time in a timezone", "parameters": TIME_PARAMS},
}
TOOLS = [WEATHER, CLOCK]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris, in fahrenheit?"}]
NO_ASK = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


def provider(**kwargs) -> SimulatedProvider:
    kwargs.setdefault("latency_scale", 0)
    kwargs.setdefault("seed", 3)
    return SimulatedProvider("holysheep", MODELS, **kwargs)


def sdk(sim: SimulatedProvider) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{sim.name}.sim/v1",
        api_key="sim",
        max_retries=0,
        http_client=httpx2.Client(transport=make_transport(sim)),
    )


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    with sdk(provider()) as c:
        yield c


def raw_chunks(sim: SimulatedProvider, body: dict) -> list[dict]:
    """The JSON of every ``data:`` event of a chat stream, read without the SDK."""
    with httpx2.Client(transport=make_transport(sim)) as http:
        response = http.post("http://holysheep.sim/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


# ---- tool calls ---------------------------------------------------------------------------------


def test_auto_calls_the_tool_the_prompt_asks_for_with_schema_valid_arguments(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.refusal is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_PARAMS)
    assert arguments["city"] == "Paris"  # taken from the prompt
    assert arguments["unit"] == "fahrenheit"  # the enum value the prompt names
    assert reply.usage.completion_tokens == len(tokenize("get_weather")) + len(tokenize(call.function.arguments))


def test_auto_answers_with_text_when_the_prompt_asks_for_no_tool(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, tools=TOOLS, tool_choice="auto")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content.startswith("[simulated holysheep/gpt-4.1]")
    assert reply.choices[0].finish_reason == "stop"


def test_auto_calls_a_tool_when_asked_to_use_one_without_naming_it(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Please use the tool for this one."}]
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=[CLOCK])
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_time"]


def test_a_description_match_asks_for_the_tool(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the local time in the Tokyo timezone?"}]
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=[CLOCK])
    assert reply.choices[0].message.tool_calls[0].function.name == "get_time"


def test_required_calls_a_tool_even_when_not_asked(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, tools=TOOLS, tool_choice="required")
    [call] = reply.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_named_tool_choice_calls_that_tool_only(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    reply = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS, tool_choice=choice)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), TIME_PARAMS)


def test_none_never_calls_even_when_asked(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS, tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_a_prompt_naming_two_tools_gets_two_parallel_calls_unless_parallel_is_off(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Call get_time for Europe/Paris and get_weather for Paris."}]
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS, parallel_tool_calls=True)
    calls = reply.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time", "get_weather"]  # in the order the prompt names them
    assert len({c.id for c in calls}) == 2
    single = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS, parallel_tool_calls=False)
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_time"]


def test_the_tool_round_trip_answers_with_the_tool_output(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    conversation = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 71, "sky": "drizzle"})},
    ]
    second = client.chat.completions.create(model="gpt-4.1", messages=conversation, tools=TOOLS)
    answer = second.choices[0].message
    assert answer.tool_calls is None
    assert second.choices[0].finish_reason == "stop"
    assert "get_weather" in answer.content
    assert "71" in answer.content and "drizzle" in answer.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are read


def test_max_tokens_cuts_a_tool_call_like_a_real_model(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS)
    arguments = whole.choices[0].message.tool_calls[0].function.arguments
    cut = client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, tools=TOOLS, max_tokens=8)
    assert cut.choices[0].finish_reason == "length"
    [call] = cut.choices[0].message.tool_calls
    assert arguments.startswith(call.function.arguments) and call.function.arguments != arguments
    assert cut.usage.completion_tokens == 8


def test_a_tool_message_without_a_preceding_call_is_refused(client: openai.OpenAI) -> None:
    messages = [*ASK_WEATHER, {"role": "tool", "tool_call_id": "call_nowhere", "content": "{}"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS)
    assert "tool" in caught.value.message


def test_tool_calls_without_their_results_are_refused(client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [*ASK_WEATHER, {"role": "assistant", "content": None, "tool_calls": [call]}, *NO_ASK]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS)
    assert "call_1" in caught.value.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ],
)
def test_invalid_tool_requests_are_400(client: openai.OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=ASK_WEATHER, **extra)
    assert caught.value.param == param


def test_streamed_tool_calls_are_reassembled_by_the_sdk_stream_helper(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Call get_time for Europe/Paris and get_weather for Paris."}]
    whole = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS)
    with client.chat.completions.stream(model="gpt-4.1", messages=messages, tools=TOOLS) as stream:
        done = [event for event in stream if event.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    expected = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == expected
    assert [(e.name, e.arguments) for e in done] == expected
    assert final.choices[0].finish_reason == "tool_calls"


def test_streamed_tool_call_deltas_have_openais_shape() -> None:
    chunks = raw_chunks(provider(), {"model": "gpt-4.1", "messages": ASK_WEATHER, "tools": TOOLS})
    deltas = [c["choices"][0]["delta"] for c in chunks]
    first = deltas[0]
    assert first["role"] == "assistant" and first["content"] is None
    [start] = first["tool_calls"]
    assert start["index"] == 0 and start["id"].startswith("call_") and start["type"] == "function"
    assert start["function"] == {"name": "get_weather", "arguments": ""}
    fragments = deltas[1:-1]
    assert fragments and all(set(d) == {"tool_calls"} for d in fragments)
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in fragments)
    assert all(set(d["tool_calls"][0]["function"]) == {"arguments"} for d in fragments)
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in fragments)
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


class Forecast(BaseModel):
    city: str
    days: int


def test_pydantic_function_tools_parse_their_arguments(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Use the forecast tool for Lyon."}]
    tool = openai.pydantic_function_tool(Forecast, name="forecast")
    completion = client.chat.completions.parse(model="gpt-4.1", messages=messages, tools=[tool])
    parsed = completion.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, Forecast)


def test_every_message_shape_is_accepted(client: openai.OpenAI) -> None:
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "system", "content": [{"type": "text", "text": "You are a test."}]},
        {
            "role": "user",
            "name": "ops",
            "content": [
                {"type": "text", "text": "Look at this."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERg=="}},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Seen."}], "refusal": None},
        {"role": "user", "content": "Thanks."},
    ]
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages, extra_body={"not_a_real_param": 1})
    assert '"Thanks."' in reply.choices[0].message.content


# ---- structured output --------------------------------------------------------------------------


class Step(BaseModel):
    explanation: str
    output: int | None


class Solution(BaseModel):
    steps: list[Step]
    final_answer: str
    confidence: Literal["low", "high"]


def test_parse_with_a_pydantic_response_format_gives_the_model(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Solve 8x + 7 = -23 step by step."}]
    completion = client.chat.completions.parse(model="gpt-4.1", messages=messages, response_format=Solution)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Solution)
    assert parsed.steps and isinstance(parsed.steps[0], Step)
    assert Solution.model_validate_json(completion.choices[0].message.content) == parsed


def test_json_schema_with_refs_and_closed_objects_is_followed(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "owner": {"$ref": "#/$defs/person"},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "minItems": 2, "uniqueItems": True},
            "kind": {"anyOf": [{"type": "integer", "minimum": 3}, {"type": "null"}]},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        },
        "required": ["owner", "tags", "kind", "code"],
        "additionalProperties": False,
        "$defs": {
            "person": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer", "exclusiveMinimum": 17}},
                "required": ["name", "age"],
                "additionalProperties": False,
            }
        },
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": True}}
    first = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, response_format=response_format)
    value = json.loads(first.choices[0].message.content)
    jsonschema.validate(value, schema)
    second = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, response_format=response_format)
    assert second.choices[0].message.content == first.choices[0].message.content


def test_json_object_format_gives_a_json_object(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Reply in JSON about canaries."}]
    reply = client.chat.completions.create(model="gpt-4.1", messages=messages, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


# ---- logprobs, n, stop, length, seed ------------------------------------------------------------


def test_logprobs_cover_every_token_with_top_alternatives(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, logprobs=True, top_logprobs=3)
    content = reply.choices[0].message.content
    entries = reply.choices[0].logprobs.content
    assert reply.choices[0].logprobs.refusal is None
    assert "".join(e.token for e in entries) == content
    assert len(entries) == len(tokenize(content))
    for entry in entries:
        assert bytes(entry.bytes).decode() == entry.token
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        ranked = [t.logprob for t in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
    plain = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK)
    assert plain.choices[0].logprobs is None


def test_streamed_logprobs_come_with_each_token(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, logprobs=True, stream=True)
    with_text = [c for c in stream if c.choices and c.choices[0].delta.content]
    assert with_text
    for chunk in with_text:
        [entry] = chunk.choices[0].logprobs.content
        assert entry.token == chunk.choices[0].delta.content


def test_top_logprobs_needs_logprobs(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, top_logprobs=2)
    assert caught.value.param == "top_logprobs"


def test_n_choices_are_distinct_and_indexed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert len(set(texts)) == 3
    single = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK)
    assert texts[0] == single.choices[0].message.content
    assert reply.usage.completion_tokens == sum(len(tokenize(t)) for t in texts)


def test_n_choices_stream_interleaved_by_index(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, n=3)
    stream = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, n=3, stream=True)
    texts: dict[int, str] = defaultdict(str)
    order: list[int] = []
    finishes: dict[int, list[str]] = defaultdict(list)
    for chunk in stream:
        [choice] = chunk.choices
        order.append(choice.index)
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index].append(choice.finish_reason)
    assert dict(texts) == {c.index: c.message.content for c in whole.choices}
    last_of_first = len(order) - 1 - order[::-1].index(0)
    assert order.index(2) < last_of_first  # interleaved, not one choice after the other
    assert dict(finishes) == {0: ["stop"], 1: ["stop"], 2: ["stop"]}


def test_stop_cuts_the_text_before_the_stop_string(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK).choices[0].message.content
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, stop=["answer", "zzz-never"])
    text = reply.choices[0].message.content
    assert text == full[: full.index("answer")]
    assert reply.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, stop="answer", stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == text


def test_the_seed_makes_the_answer_repeatable(client: openai.OpenAI) -> None:
    def text(seed: int) -> str:
        return client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, seed=seed).choices[0].message.content

    assert text(1) == text(1)
    assert len({text(1), text(2), text(3)}) > 1


# ---- usage, reasoning, fingerprint, headers -----------------------------------------------------


def test_reasoning_effort_spends_counted_reasoning_tokens(client: openai.OpenAI) -> None:
    spent = []
    for effort in ("low", "medium", "high"):
        reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, reasoning_effort=effort)
        usage = reply.usage
        reasoning = usage.completion_tokens_details.reasoning_tokens
        assert reasoning > 0
        assert usage.completion_tokens == reasoning + len(tokenize(reply.choices[0].message.content))
        spent.append(reasoning)
    assert spent == sorted(spent) and len(set(spent)) == 3
    plain = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK)
    details = plain.usage.completion_tokens_details
    assert (details.reasoning_tokens, details.audio_tokens) == (0, 0)
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)
    assert plain.usage.prompt_tokens_details.audio_tokens == 0


def test_reasoning_counts_against_max_completion_tokens(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="gpt-4.1", messages=NO_ASK, reasoning_effort="high", max_completion_tokens=20
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == ""
    assert reply.usage.completion_tokens == reply.usage.completion_tokens_details.reasoning_tokens == 20


def test_fingerprint_service_tier_and_refusal(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK)
    assert reply.system_fingerprint == "fp_sim_holysheep"
    assert reply.service_tier == "default"
    assert reply.choices[0].message.refusal is None
    flex = client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, service_tier="flex")
    assert flex.service_tier == "flex"


def test_usage_chunk_only_when_include_usage_is_asked() -> None:
    sim = provider()
    body = {"model": "gpt-4.1", "messages": NO_ASK}
    plain = raw_chunks(sim, body)
    assert all("usage" not in c for c in plain)
    assert all(c["choices"] for c in plain)
    counted = raw_chunks(sim, {**body, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in counted[:-1])
    assert counted[-1]["choices"] == []
    assert counted[-1]["usage"]["completion_tokens"] > 0
    assert counted[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}


def test_stream_options_need_stream(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=NO_ASK, stream_options={"include_usage": True})
    assert caught.value.param == "stream_options"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_response_headers_report_the_rate_limit_budget() -> None:
    clock = Clock()
    with sdk(provider(clock=clock)) as client:
        first = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=NO_ASK)
        clock.now += 1.5
        second = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=NO_ASK)
        clock.now += 61
        later = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=NO_ASK)
    for raw in (first, second, later):
        for header in (
            "x-request-id",
            "openai-processing-ms",
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-requests",
            "x-ratelimit-reset-tokens",
        ):
            assert raw.headers.get(header), header
    limit = int(first.headers["x-ratelimit-limit-requests"])
    assert int(first.headers["x-ratelimit-remaining-requests"]) == limit - 1
    assert int(second.headers["x-ratelimit-remaining-requests"]) == limit - 2
    used = first.parse().usage.total_tokens
    tokens_limit = int(first.headers["x-ratelimit-limit-tokens"])
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == tokens_limit - used
    assert int(later.headers["x-ratelimit-remaining-requests"]) == limit - 1  # the minute has passed
    assert second.headers["x-ratelimit-reset-requests"] == "58.5s"


# ---- refusals of invalid requests ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"top_p": 1.5}, "top_p"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"seed": 2**70}, "seed"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
    ],
)
def test_invalid_known_parameters_are_openai_shaped_400s(extra: dict, param: str) -> None:
    with httpx2.Client(transport=make_transport(provider())) as http:
        response = http.post(
            "http://holysheep.sim/v1/chat/completions", json={"model": "gpt-4.1", "messages": NO_ASK, **extra}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "\xff"}]}',
        b"[" * 100_000,
    ],
)
def test_hostile_bodies_are_400_not_500(content: bytes) -> None:
    with httpx2.Client(transport=make_transport(provider())) as http:
        response = http.post("http://holysheep.sim/v1/chat/completions", content=content)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_streamed_structured_output_is_parsed_by_the_stream_helper(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Solve 2x = 4."}]
    with client.chat.completions.stream(model="gpt-4.1", messages=messages, response_format=Solution) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Solution)
