"""The simulator's whole surface over loopback HTTP, driven by the openai SDK with its default HTTP
client: Responses SSE with ``event:`` lines, streamed tool calls, embeddings, legacy completions,
stored responses, models, the ``apis`` restriction, OpenAI's headers and a stream-break fault."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import openai
import pytest

from app.simulator import SimulatedProvider, SimulatorHTTPServer, make_server
from core.faults import FaultSettings

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Faults:
    def __init__(self) -> None:
        self.settings = FaultSettings()

    def __call__(self) -> FaultSettings:
        return self.settings


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
def server(faults: Faults) -> Iterator[SimulatorHTTPServer]:
    providers = {
        "full": SimulatedProvider(
            "full", ["gpt-4.1", "text-embedding-3-small"], latency_scale=0, seed=1, faults=faults
        ),
        "chatonly": SimulatedProvider("chatonly", ["gpt-4.1"], latency_scale=0, seed=2, apis={"chat"}),
    }
    srv = make_server(providers, "127.0.0.1", 0, hold_s=5.0)
    thread = srv.start_in_thread()
    yield srv
    srv.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def client_for(server: SimulatorHTTPServer, name: str = "full") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/{name}/v1", api_key="sim", max_retries=0)


def test_responses_stream_is_event_and_data_lines(server: SimulatorHTTPServer) -> None:
    body = {"model": "gpt-4.1", "input": "Stream over a socket.", "stream": True}
    with httpx2.stream("POST", f"{server.url}/full/v1/responses", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert "[DONE]" not in text  # the Responses API ends with response.completed, not [DONE]
    numbers = []
    for block in blocks:
        event_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {payload['type']}"
        numbers.append(payload["sequence_number"])
    assert numbers == list(range(len(blocks)))
    assert json.loads(blocks[-1].split("\n")[1].removeprefix("data: "))["type"] == "response.completed"


def test_sdk_responses_over_http(server: SimulatorHTTPServer) -> None:
    with client_for(server) as client:
        with client.responses.stream(model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER]) as stream:
            final = stream.get_final_response()
        [call] = final.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}
        follow = client.responses.create(
            model="gpt-4.1",
            previous_response_id=final.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 C"}],
        )
        assert "sunny" in follow.output_text
        assert client.responses.retrieve(follow.id).id == follow.id
        deleted = client.responses.delete(follow.id)
        assert deleted is None  # the SDK returns nothing for a delete
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(follow.id)


def test_chat_tool_call_stream_over_http(server: SimulatorHTTPServer) -> None:
    tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    with client_for(server) as client:
        with client.chat.completions.stream(model="gpt-4.1", messages=messages, tools=tools) as stream:
            final = stream.get_final_completion()
        [call] = final.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})


def test_embeddings_and_completions_over_http(server: SimulatorHTTPServer) -> None:
    with client_for(server) as client:
        default = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"], dimensions=32)
        floats = client.embeddings.create(
            model="text-embedding-3-small", input=["a", "b"], dimensions=32, encoding_format="float"
        )
        for decoded, plain in zip(default.data, floats.data, strict=True):
            assert decoded.embedding == pytest.approx(plain.embedding)
        assert [len(d.embedding) for d in floats.data] == [32, 32]
        streamed = list(client.completions.create(model="gpt-4.1", prompt="over http", stream=True))
        whole = client.completions.create(model="gpt-4.1", prompt="over http")
        assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_openai_headers_over_http(server: SimulatorHTTPServer) -> None:
    with client_for(server) as client:
        raw = client.responses.with_raw_response.create(model="gpt-4.1", input="headers")
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
        stream = client.chat.completions.with_raw_response.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert stream.headers["x-ratelimit-remaining-requests"]
        list(stream.parse())


def test_models_and_apis_over_http(server: SimulatorHTTPServer) -> None:
    with client_for(server) as client:
        assert client.models.retrieve("text-embedding-3-small").id == "text-embedding-3-small"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nope")
    with client_for(server, "chatonly") as client:
        assert client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]).choices
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.create(model="gpt-4.1", input="x")
        assert caught.value.body["code"] == "unknown_url"


def test_stream_break_over_http_on_a_responses_stream(server: SimulatorHTTPServer, faults: Faults) -> None:
    faults.settings = FaultSettings(stream_break_rate=1.0)
    with client_for(server) as client:
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for event in client.responses.create(model="gpt-4.1", input="x", stream=True):
                received.append(event.type)
        assert "response.output_text.delta" in received
        assert "response.completed" not in received
