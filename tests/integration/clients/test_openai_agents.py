"""The OpenAI Agents SDK (``openai-agents``) through the gateway's Responses bridge: its
``OpenAIResponsesModel`` speaks the Responses API to a gateway whose providers serve only chat
completions, so every request is translated to chat (app/routing/bridge.py) and every answer back.

Each test runs the SDK as an application would (``Runner.run_sync`` or ``Runner.run_streamed``)
against a real ``serve`` process and a scripted loopback upstream (tests/integration/clients/conftest.py), and
checks both ends: what the agent returned or raised, and the chat completions request the upstream
received. Every body and SSE event the SDK read is validated against the official OpenAI schemas.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import (
    Agent,
    ModelRefusalError,
    ModelSettings,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from pydantic import BaseModel

from tests.integration.clients.expect import MODEL, SNAPSHOT
from tests.support.chaos_upstream import (
    chat_body,
    chat_chunk,
    choice,
    logprobs_body,
    refusal_body,
    reply,
    sse,
    text_chunks,
    tool_call,
    tool_call_body,
    tool_call_chunks,
    usage,
)

set_tracing_disabled(True)  # the SDK's tracing would export to the vendor's servers
RUN = RunConfig(tracing_disabled=True)
CHAT_PATH = "/direct/v1/chat/completions"


class Weather(BaseModel):
    city: str
    temp_c: int


@function_tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return json.dumps({"city": city, "temp_c": 3})


def agent(target: Any, **kw: Any) -> Agent:
    """An agent on the gateway's Responses API (a fresh client: each run has its own event loop)."""
    model = OpenAIResponsesModel(model=MODEL, openai_client=target.async_openai())
    return Agent(name="helper", instructions="Be brief.", model=model, **kw)


def streamed(target: Any, prompt: str = "hi", **kw: Any) -> tuple[Any, list[Any]]:
    async def main() -> tuple[Any, list[Any]]:
        result = Runner.run_streamed(agent(target, **kw), prompt, run_config=RUN)
        return result, [e async for e in result.stream_events()]

    return asyncio.run(main())


def raw_types(events: list[Any]) -> list[str]:
    return [e.data.type for e in events if e.type == "raw_response_event"]


def chunk(delta: dict, *, finish: str | None = None, logprobs: dict | None = None) -> dict:
    return chat_chunk(SNAPSHOT, [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}])


# ------------------------------------------------------------------------------------- no tools
def test_run_sync_without_tools_sends_chat_no_empty_tools(bridged):
    result = Runner.run_sync(agent(bridged), "hello", run_config=RUN)
    assert result.final_output == "Hello from the scripted upstream."
    sent = bridged.last
    assert sent.path == CHAT_PATH
    # The SDK sends tools: [] (and would have sent parallel_tool_calls); chat refuses an empty array.
    assert bridged.tap.last.sent_json["tools"] == [] and "tools" not in sent.json
    assert "parallel_tool_calls" not in sent.json
    assert sent.json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ]
    assert bridged.validate_all() == 1


def test_run_streamed_without_tools(bridged):
    bridged.script(sse(text_chunks(SNAPSHOT, "Streaming through the bridge")))
    result, events = streamed(bridged)
    assert result.final_output == "Streaming through the bridge"
    kinds = raw_types(events)
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert bridged.last.json["stream"] is True and "tools" not in bridged.last.json
    assert bridged.validate_all() == len(kinds)


# ------------------------------------------------------------------------------------ with tools
def test_run_sync_with_a_tool_round_trip(bridged):
    bridged.script(
        reply(tool_call_body(SNAPSHOT, [tool_call("call_w1", "get_weather", {"city": "Oslo"})])),
        reply(chat_body(SNAPSHOT, [choice(content="It is 3 C in Oslo.")])),
    )
    result = Runner.run_sync(agent(bridged, tools=[get_weather]), "weather in Oslo?", run_config=RUN)
    assert result.final_output == "It is 3 C in Oslo."
    first, second = bridged.received
    assert [t["function"]["name"] for t in first.json["tools"]] == ["get_weather"]
    assert first.json["tools"][0]["function"]["parameters"]["required"] == ["city"]
    messages = second.json["messages"]
    call = {"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    assert {"role": "assistant", "content": None, "tool_calls": [call]} in messages
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_w1", "content": '{"city": "Oslo", "temp_c": 3}'}
    assert bridged.validate_all() == 2


def test_run_streamed_with_a_tool_round_trip(bridged):
    bridged.script(
        sse(tool_call_chunks(SNAPSHOT, [tool_call("call_s1", "get_weather", {"city": "Lima"})])),
        sse(text_chunks(SNAPSHOT, "Lima: 3 C.")),
    )
    result, events = streamed(bridged, "weather in Lima?", tools=[get_weather])
    assert result.final_output == "Lima: 3 C."
    outputs = [e.item.output for e in events if e.type == "run_item_stream_event" and e.name == "tool_output"]
    assert outputs == ['{"city": "Lima", "temp_c": 3}']
    assert "response.function_call_arguments.delta" in raw_types(events)
    assert bridged.received[1].json["messages"][-1]["tool_call_id"] == "call_s1"
    assert bridged.validate_all() == len(raw_types(events))


# ---------------------------------------------------------------------------- structured output
def test_output_type_is_a_json_schema_response_format(bridged):
    bridged.script(reply(chat_body(SNAPSHOT, [choice(content='{"city": "Kyiv", "temp_c": -2}')])))
    result = Runner.run_sync(agent(bridged, output_type=Weather), "weather in Kyiv?", run_config=RUN)
    assert result.final_output == Weather(city="Kyiv", temp_c=-2)
    fmt = bridged.last.json["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert set(fmt["json_schema"]["schema"]["properties"]) == {"city", "temp_c"}
    assert "tools" not in bridged.last.json  # structured-output agents send tools: [] too
    assert bridged.validate_all() == 1


# ---------------------------------------------------------------------------------------- refusal
def test_a_refusal_raises_model_refusal_error(bridged):
    bridged.script(reply(refusal_body(SNAPSHOT, "I can't help with that.")))
    with pytest.raises(ModelRefusalError) as exc:
        Runner.run_sync(agent(bridged, output_type=Weather), "something bad", run_config=RUN)
    assert exc.value.refusal == "I can't help with that."
    assert bridged.validate_all() == 1


def test_a_streamed_refusal_raises_model_refusal_error(bridged):
    bridged.script(
        sse(
            [
                chunk({"role": "assistant", "content": None, "refusal": ""}),
                chunk({"refusal": "I can't "}),
                chunk({"refusal": "help with that."}),
                chunk({}, finish="stop"),
                chat_chunk(SNAPSHOT, [], usage_=usage(9, 5)),
            ]
        )
    )
    seen: list[Any] = []

    async def main() -> None:
        result = Runner.run_streamed(agent(bridged), "something bad", run_config=RUN)
        async for e in result.stream_events():
            seen.append(e)

    with pytest.raises(ModelRefusalError) as exc:
        asyncio.run(main())
    assert exc.value.refusal == "I can't help with that."
    kinds = raw_types(seen)
    assert kinds.count("response.refusal.delta") == 2 and "response.refusal.done" in kinds
    assert bridged.validate_all() == len(kinds)


# --------------------------------------------------------------------------------------- logprobs
def test_top_logprobs_come_back_in_the_output_text(bridged):
    bridged.script(reply(logprobs_body(SNAPSHOT)))
    result = Runner.run_sync(agent(bridged, model_settings=ModelSettings(top_logprobs=2)), "hi", run_config=RUN)
    assert result.final_output == "Hello!"
    sent = bridged.last.json
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    assert bridged.tap.last.sent_json["include"] == ["message.output_text.logprobs"]
    part = result.raw_responses[0].output[0].content[0]
    assert [(lp.token, [t.token for t in lp.top_logprobs]) for lp in part.logprobs] == [
        ("Hello", ["Hello", "Hi"]),
        ("!", ["!", "."]),
    ]
    assert bridged.validate_all() == 1


def test_streamed_logprobs_ride_on_the_deltas(bridged):
    body = logprobs_body(SNAPSHOT)
    entries = body["choices"][0]["logprobs"]["content"]
    bridged.script(
        sse(
            [
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hello"}, logprobs={"content": entries[:1], "refusal": None}),
                chunk({"content": "!"}, logprobs={"content": entries[1:], "refusal": None}),
                chunk({}, finish="stop"),
                chat_chunk(SNAPSHOT, [], usage_=usage(4, 2)),
            ]
        )
    )
    result, events = streamed(bridged, model_settings=ModelSettings(top_logprobs=2))
    assert result.final_output == "Hello!"
    deltas = [e.data for e in events if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    assert [[lp.token for lp in d.logprobs] for d in deltas] == [["Hello"], ["!"]]
    final = result.raw_responses[0].output[0].content[0]
    assert [lp.token for lp in final.logprobs] == ["Hello", "!"]
    assert bridged.last.json["logprobs"] is True and bridged.last.json["top_logprobs"] == 2
    assert bridged.validate_all() == len(raw_types(events))
