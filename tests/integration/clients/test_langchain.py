"""LangChain's ``ChatOpenAI`` (langchain-openai, over openai-python) pointed at the gateway with
``base_url`` and ``api_key``: a ``bind_tools`` round trip (plain and streamed) and
``with_structured_output`` by each of its methods (json_schema, function_calling, json_mode). What
reaches the upstream is what LangChain sent; every body and SSE chunk LangChain read is validated
against the official OpenAI schema. ``target``: see tests/integration/clients/conftest.py.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.integration.clients.expect import MODEL, SNAPSHOT, forwarded
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


@tool
def get_weather(city: str, unit: str = "c") -> str:
    """Current weather in a city."""
    return json.dumps({"city": city, "temp": 18, "unit": unit})


class CityWeather(BaseModel):
    """Weather report for one city."""

    city: str = Field(description="the city")
    temp_c: float
    conditions: list[str]


REPORT = {"city": "Paris", "temp_c": 18.5, "conditions": ["clear", "windy"]}


def chat(target, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=target.base_url,
        api_key=target.api_key,
        max_retries=0,
        http_client=target.tap.client(),
        **kw,
    )


def sent_to_upstream_as_sent(target) -> None:
    """Every request reached the upstream as LangChain sent it (bar what the gateway owns)."""
    sent = [(ex.path, ex.sent_json) for ex in target.tap.exchanges]
    assert [r.json for r in target.received] == [forwarded(target, body, path) for path, body in sent]


def test_bind_tools_round_trip(target):
    calls = [tool_call("call_lc1", "get_weather", {"city": "Paris", "unit": "c"})]
    target.script(reply(tool_call_body(SNAPSHOT, calls)), reply(chat_body(SNAPSHOT, [choice(content="18C in Paris")])))
    llm = chat(target).bind_tools([get_weather])
    question = HumanMessage("Weather in Paris?")
    first = llm.invoke([question])
    assert first.tool_calls == [
        {"name": "get_weather", "args": {"city": "Paris", "unit": "c"}, "id": "call_lc1", "type": "tool_call"}
    ]
    result = get_weather.invoke(first.tool_calls[0])
    assert isinstance(result, ToolMessage) and result.tool_call_id == "call_lc1"
    final = llm.invoke([question, first, result])
    assert final.content == "18C in Paris"
    leg1, leg2 = (r.json for r in target.received)
    assert leg1["tools"][0]["function"]["name"] == "get_weather"
    assert leg1["tools"][0]["function"]["parameters"]["required"] == ["city"]
    assistant, tool_msg = leg2["messages"][1], leg2["messages"][2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"] == calls
    assert assistant["content"] in (None, "")  # LangChain's own choice; reaches the upstream as sent
    assert tool_msg == {"role": "tool", "tool_call_id": "call_lc1", "content": result.content}
    sent_to_upstream_as_sent(target)
    assert target.validate_all() == 2


def test_bind_tools_streamed(target):
    calls = [tool_call("call_lc2", "get_weather", {"city": "Oslo", "unit": "f"})]
    target.script(sse(tool_call_chunks(SNAPSHOT, calls, fragments=4)), sse(text_chunks(SNAPSHOT, "Cold in Oslo")))
    llm = chat(target).bind_tools([get_weather])
    question = HumanMessage("Weather in Oslo?")
    gathered = None
    for chunk in llm.stream([question]):
        gathered = chunk if gathered is None else gathered + chunk
    assert gathered is not None
    assert gathered.tool_calls == [
        {"name": "get_weather", "args": {"city": "Oslo", "unit": "f"}, "id": "call_lc2", "type": "tool_call"}
    ]
    result = get_weather.invoke(gathered.tool_calls[0])
    text = "".join(c.content for c in llm.stream([question, gathered, result]))
    assert text == "Cold in Oslo"
    assert target.received[1].json["messages"][2]["tool_call_id"] == "call_lc2"
    sent_to_upstream_as_sent(target)
    assert target.validate_all() > 6


STRUCTURED = {
    "json_schema": lambda: reply(chat_body(SNAPSHOT, [choice(content=json.dumps(REPORT))])),
    "function_calling": lambda: reply(tool_call_body(SNAPSHOT, [tool_call("call_so1", "CityWeather", REPORT)])),
    "json_mode": lambda: reply(chat_body(SNAPSHOT, [choice(content=json.dumps(REPORT))])),
}


@pytest.mark.parametrize("method", sorted(STRUCTURED))
def test_with_structured_output(target, method):
    target.script(STRUCTURED[method]())
    structured = chat(target).with_structured_output(CityWeather, method=method)
    question = "Weather in Paris as JSON with city, temp_c and conditions"
    got = structured.invoke(question)
    assert got == CityWeather(**REPORT)
    body = target.last.json
    if method == "json_schema":
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "CityWeather"
        assert set(fmt["json_schema"]["schema"]["properties"]) == {"city", "temp_c", "conditions"}
    elif method == "function_calling":
        assert body["tools"][0]["function"]["name"] == "CityWeather"
        assert body["tool_choice"]["function"]["name"] == "CityWeather"
    else:
        assert body["response_format"] == {"type": "json_object"}
    sent_to_upstream_as_sent(target)
    assert target.validate_all() == 1
