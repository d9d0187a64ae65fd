"""pydantic-ai through the gateway, with both of its OpenAI models: ``OpenAIChatModel`` (chat
completions, against ``target``: the gateway, or the scripted upstream itself to prove the test)
and ``OpenAIResponsesModel`` (the Responses API, against ``bridged``: a gateway whose providers
serve only chat completions, so the request is translated by app/routing/bridge.py).

Each test runs an ``Agent`` as an application would (``run_sync``, ``run_stream``), with text,
structured output (pydantic-ai's ``final_result`` tool) and a function tool, and checks what the
agent returned and what reached the upstream; every body and SSE event read is schema-validated.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.integration.clients.expect import MODEL, SNAPSHOT
from tests.support.chaos_upstream import (
    chat_body,
    choice,
    reply,
    sse,
    text_chunks,
    tool_call,
    tool_call_body,
    tool_call_chunks,
)

CHAT_PATH = "/direct/v1/chat/completions"


class Weather(BaseModel):
    city: str
    temp_c: int


def chat_model(target: Any) -> OpenAIChatModel:
    return OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=target.async_openai()))


def responses_model(target: Any) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=target.async_openai()))


def with_weather_tool(agent: Agent) -> Agent:
    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return json.dumps({"city": city, "temp_c": 3})

    return agent


def stream_text(agent: Agent, prompt: str) -> tuple[list[str], str]:
    async def main() -> tuple[list[str], str]:
        async with agent.run_stream(prompt) as run:
            pieces = [p async for p in run.stream_text(delta=True)]
            return pieces, await run.get_output()

    return asyncio.run(main())


# ------------------------------------------------------------------------------------- chat model
def test_chat_model_text(target):
    result = Agent(chat_model(target), instructions="Be brief.").run_sync("hello")
    assert result.output == "Hello from the scripted upstream."
    assert target.last.path == CHAT_PATH
    assert target.last.json["messages"][-1] == {"role": "user", "content": "hello"}
    assert target.validate_all() == 1


def test_chat_model_structured_output_by_its_final_result_tool(target):
    call = tool_call("call_f1", "final_result", {"city": "Oslo", "temp_c": 3})
    target.script(reply(tool_call_body(SNAPSHOT, [call])))
    result = Agent(chat_model(target), output_type=Weather).run_sync("weather in Oslo?")
    assert result.output == Weather(city="Oslo", temp_c=3)
    assert [t["function"]["name"] for t in target.last.json["tools"]] == ["final_result"]
    assert target.validate_all() == 1


def test_chat_model_stream_with_a_tool_round_trip(target):
    target.script(
        sse(tool_call_chunks(SNAPSHOT, [tool_call("call_c1", "get_weather", {"city": "Rome"})])),
        sse(text_chunks(SNAPSHOT, "Rome is at 3 C.")),
    )
    pieces, output = stream_text(with_weather_tool(Agent(chat_model(target))), "weather in Rome?")
    assert "".join(pieces) == output == "Rome is at 3 C."
    first, second = target.received
    assert first.json["stream"] is True and [t["function"]["name"] for t in first.json["tools"]] == ["get_weather"]
    tool_message = second.json["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "call_c1"
    assert json.loads(tool_message["content"]) == {"city": "Rome", "temp_c": 3}
    assert target.validate_all() > 2


# -------------------------------------------------------------------------------- responses model
def test_responses_model_text_over_the_bridge(bridged):
    result = Agent(responses_model(bridged), instructions="Be brief.").run_sync("hello")
    assert result.output == "Hello from the scripted upstream."
    assert bridged.last.path == CHAT_PATH
    assert (
        bridged.last.json["messages"]
        == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        ]
        or bridged.last.json["messages"][-1]["role"] == "user"
    )
    assert "tools" not in bridged.last.json
    assert bridged.validate_all() == 1


def test_responses_model_structured_output_over_the_bridge(bridged):
    call = tool_call("call_f2", "final_result", {"city": "Kyiv", "temp_c": -2})
    bridged.script(reply(tool_call_body(SNAPSHOT, [call])))
    result = Agent(responses_model(bridged), output_type=Weather).run_sync("weather in Kyiv?")
    assert result.output == Weather(city="Kyiv", temp_c=-2)
    assert [t["function"]["name"] for t in bridged.last.json["tools"]] == ["final_result"]
    assert bridged.validate_all() == 1


def test_responses_model_tool_round_trip_over_the_bridge(bridged):
    bridged.script(
        reply(tool_call_body(SNAPSHOT, [tool_call("call_r1", "get_weather", {"city": "Lima"})])),
        reply(chat_body(SNAPSHOT, [choice(content="Lima: 3 C.")])),
    )
    result = with_weather_tool(Agent(responses_model(bridged))).run_sync("weather in Lima?")
    assert result.output == "Lima: 3 C."
    first, second = bridged.received
    assert [t["function"]["name"] for t in first.json["tools"]] == ["get_weather"]
    messages = second.json["messages"]
    assert any(m.get("tool_calls", [{}])[0].get("id") == "call_r1" for m in messages if m["role"] == "assistant")
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == "call_r1"
    assert bridged.validate_all() == 2


def test_responses_model_stream_over_the_bridge(bridged):
    bridged.script(sse(text_chunks(SNAPSHOT, "Streamed over the bridge.")))
    pieces, output = stream_text(Agent(responses_model(bridged)), "hi")
    assert "".join(pieces) == output == "Streamed over the bridge."
    assert bridged.last.json["stream"] is True
    assert bridged.validate_all() > 3
