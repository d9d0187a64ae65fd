"""The simulator's other endpoints through the real openai SDK over the mock transport: embeddings,
legacy completions, the Responses API (plain, streamed, function calls, structured output,
previous_response_id), models.retrieve, the ``apis`` restriction, and the faults on every new
endpoint."""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Iterator

import httpx2
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from app.simulator import SimulatedProvider, make_transport
from app.simulator.tokens import tokenize
from core.faults import FaultSettings

MODELS = ["gpt-4.1", "text-embedding-3-small"]
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": WEATHER_PARAMS,
    "strict": True,
}


def provider(faults: FaultSettings | None = None, **kwargs) -> SimulatedProvider:
    settings = faults or FaultSettings()
    kwargs.setdefault("latency_scale", 0)
    kwargs.setdefault("seed", 5)
    return SimulatedProvider("direct", MODELS, faults=lambda: settings, **kwargs)


def sdk(sim: SimulatedProvider, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://{sim.name}.sim/v1",
        api_key="sim",
        max_retries=0,
        http_client=httpx2.Client(transport=make_transport(sim)),
        **kwargs,
    )


@pytest.fixture
def client() -> Iterator[openai.OpenAI]:
    with sdk(provider()) as c:
        yield c


# ---- embeddings ---------------------------------------------------------------------------------


def test_embeddings_are_deterministic_unit_vectors(client: openai.OpenAI) -> None:
    first = client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"], encoding_format="float")
    again = client.embeddings.create(model="text-embedding-3-small", input="alpha", encoding_format="float")
    assert first.object == "list" and first.model == "text-embedding-3-small"
    assert [d.index for d in first.data] == [0, 1]
    assert all(d.object == "embedding" for d in first.data)
    alpha, beta = (d.embedding for d in first.data)
    assert again.data[0].embedding == alpha
    assert alpha != beta
    assert len(alpha) == len(beta) > 0
    assert math.isclose(math.fsum(v * v for v in alpha), 1.0, rel_tol=1e-5)
    assert first.usage.prompt_tokens == first.usage.total_tokens == len(tokenize("alpha")) + len(tokenize("beta"))
    other_model = client.embeddings.create(model="gpt-4.1", input="alpha", encoding_format="float")
    assert other_model.data[0].embedding != alpha  # seeded by (model, text)


def test_dimensions_shorten_and_renormalise(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model="text-embedding-3-small", input="gamma", encoding_format="float")
    short = client.embeddings.create(
        model="text-embedding-3-small", input="gamma", dimensions=12, encoding_format="float"
    )
    vector = short.data[0].embedding
    assert len(vector) == 12
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-5)
    head = full.data[0].embedding[:12]
    norm = math.sqrt(math.fsum(v * v for v in head))
    assert vector == pytest.approx([v / norm for v in head], rel=1e-5)


def test_base64_decodes_to_the_same_float32_values(client: openai.OpenAI) -> None:
    floats = client.embeddings.create(
        model="text-embedding-3-small", input="delta", dimensions=64, encoding_format="float"
    )
    raw = client.embeddings.with_raw_response.create(
        model="text-embedding-3-small", input="delta", dimensions=64, encoding_format="base64"
    )
    encoded = json.loads(raw.http_response.text)["data"][0]["embedding"]
    assert isinstance(encoded, str)
    decoded = list(struct.unpack("<64f", base64.b64decode(encoded)))
    assert decoded == floats.data[0].embedding
    # The SDK's default asks for base64 and decodes it itself.
    assert client.embeddings.create(model="text-embedding-3-small", input="delta", dimensions=64).data[
        0
    ].embedding == pytest.approx(decoded)


def test_token_array_inputs_are_embedded(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model="text-embedding-3-small", input=[1, 2, 3], encoding_format="float")
    many = client.embeddings.create(model="text-embedding-3-small", input=[[1, 2, 3], [4]], encoding_format="float")
    assert len(one.data) == 1 and len(many.data) == 2
    assert many.data[0].embedding == one.data[0].embedding
    assert many.usage.prompt_tokens == 4


@pytest.mark.parametrize(
    "extra",
    [
        {"input": ""},
        {"input": []},
        {"input": ["a"] * 2049},
        {"input": ["ok", ""]},
        {"input": [1, "a"]},
        {"input": [True]},
        {"dimensions": 0},
        {"encoding_format": "hex"},
    ],
)
def test_invalid_embedding_requests_are_400(client: openai.OpenAI, extra: dict) -> None:
    body = {"model": "text-embedding-3-small", "input": "x", **extra}
    with pytest.raises(openai.BadRequestError) as caught:
        client.post("/embeddings", body=body, cast_to=object)
    assert caught.value.body["type"] == "invalid_request_error"


# ---- legacy completions -------------------------------------------------------------------------


def test_legacy_completion_defaults_to_16_tokens(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="gpt-4.1", prompt="Say this is a test")
    assert reply.object == "text_completion"
    [choice] = reply.choices
    assert choice.index == 0 and choice.logprobs is None
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == len(tokenize(choice.text)) == 16
    assert reply.usage.prompt_tokens == len(tokenize("Say this is a test"))


def test_legacy_completion_prompts_n_echo_stop_and_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model="gpt-4.1", prompt=["first prompt", "second prompt"], n=2, max_tokens=200, echo=True, logprobs=2
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text.startswith("first prompt") and reply.choices[2].text.startswith("second prompt")
    assert reply.choices[0].text != reply.choices[1].text
    logprobs = reply.choices[0].logprobs
    assert "first prompt" + "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == len(logprobs.top_logprobs)
    assert all(len(top) == 2 for top in logprobs.top_logprobs)
    stopped = client.completions.create(model="gpt-4.1", prompt="first prompt", max_tokens=200, stop="answer")
    assert stopped.choices[0].finish_reason == "stop"
    assert "answer" not in stopped.choices[0].text
    assert reply.choices[0].text.removeprefix("first prompt").startswith(stopped.choices[0].text)


def test_legacy_completion_streams(client: openai.OpenAI) -> None:
    whole = client.completions.create(model="gpt-4.1", prompt="stream this", max_tokens=30)
    chunks = list(
        client.completions.create(
            model="gpt-4.1", prompt="stream this", max_tokens=30, stream=True, stream_options={"include_usage": True}
        )
    )
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30


# ---- responses ----------------------------------------------------------------------------------


def test_a_plain_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model="gpt-4.1", input="Tell me about canaries.", instructions="Be brief.")
    assert response.id.startswith("resp_")
    assert response.object == "response" and response.status == "completed"
    assert response.instructions == "Be brief."
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    [part] = message.content
    assert part.type == "output_text" and part.annotations == []
    assert response.output_text == part.text
    assert '"Tell me about canaries."' in part.text
    usage = response.usage
    assert usage.output_tokens == len(tokenize(part.text))
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.parallel_tool_calls is True and response.tool_choice == "auto" and response.tools == []
    assert response.text.format.type == "text"


def test_message_items_with_parts_are_read(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="gpt-4.1",
        input=[
            {"role": "developer", "content": "Answer in one line."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is a canary release?"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A slow rollout."}]},
            {"role": "user", "content": [{"type": "input_text", "text": "And a rollback?"}]},
        ],
    )
    assert '"And a rollback?"' in response.output_text


def test_a_streamed_response_has_the_semantic_events(client: openai.OpenAI) -> None:
    with client.responses.stream(model="gpt-4.1", input="Stream a story.") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress"
    assert final.status == "completed" and final.usage.output_tokens == len(tokenize(final.output_text))


def test_create_stream_true_yields_typed_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="gpt-4.1", input="Stream a story.", stream=True))
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text


def test_a_function_call_and_its_output_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER_PARAMS)
    assert arguments["city"] == "Oslo"
    second = client.responses.create(
        model="gpt-4.1",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": -3}'}],
        tools=[WEATHER],
    )
    assert second.previous_response_id == first.id
    assert second.output[0].type == "message"
    assert "get_weather" in second.output_text and "-3" in second.output_text


def test_streamed_function_call_arguments(client: openai.OpenAI) -> None:
    with client.responses.stream(model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(deltas) == done.arguments == final.output[0].arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMS)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_choices_call_the_function(client: openai.OpenAI, tool_choice: object) -> None:
    response = client.responses.create(model="gpt-4.1", input="Hello there.", tools=[WEATHER], tool_choice=tool_choice)
    assert [item.type for item in response.output] == ["function_call"]


def test_tool_choice_none_answers_with_text(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER], tool_choice="none"
    )
    assert [item.type for item in response.output] == ["message"]


class Release(BaseModel):
    version: str
    canary_percent: int
    notes: list[str]


def test_structured_output_parses(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model="gpt-4.1", input="Describe the next release.", text_format=Release)
    assert isinstance(parsed.output_parsed, Release)
    json_object = client.responses.create(
        model="gpt-4.1", input="Describe it in JSON.", text={"format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(json_object.output_text), dict)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="gpt-4.1", input="My name is Ada and I run the canary of the gateway; the ratio is ten percent today."
    )
    second = client.responses.create(
        model="gpt-4.1", input="What did I say my name was?", previous_response_id=first.id
    )
    # The continuation reads the first turn and its answer: its prefix is the first request's.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    assert 0 < cached <= first.usage.input_tokens
    assert '"What did I say my name was?"' in second.output_text
    assert client.responses.retrieve(first.id).output_text == first.output_text


def test_a_function_call_output_without_its_call_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="gpt-4.1", input=[{"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}]
        )
    assert "call_nowhere" in caught.value.message


def test_continuing_a_function_call_without_its_output_is_refused(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER])
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-4.1", input="Never mind.", previous_response_id=first.id, tools=[WEATHER])
    assert first.output[0].call_id in caught.value.message


def test_an_unknown_previous_response_id_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-4.1", input="Hi", previous_response_id="resp_unknown")
    assert caught.value.code == "previous_response_not_found"
    assert caught.value.param == "previous_response_id"


def test_store_false_responses_cannot_be_continued(client: openai.OpenAI) -> None:
    first = client.responses.create(model="gpt-4.1", input="Forget this.", store=False)
    assert first.store is False
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="gpt-4.1", input="Hi", previous_response_id=first.id)


def test_the_store_is_bounded() -> None:
    from app.simulator.responses import ResponseStore

    sim = provider(response_store=ResponseStore(max_entries=2))
    with sdk(sim) as client:
        ids = [client.responses.create(model="gpt-4.1", input=f"turn {i}").id for i in range(3)]
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="gpt-4.1", input="Hi", previous_response_id=ids[0])
        assert client.responses.create(model="gpt-4.1", input="Hi", previous_response_id=ids[2]).output_text
    assert len(sim.responses) == 2


def test_max_output_tokens_and_reasoning(client: openai.OpenAI) -> None:
    cut = client.responses.create(model="gpt-4.1", input="Tell me a long story.", max_output_tokens=16)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 16
    reasoned = client.responses.create(model="gpt-4.1", input="Think first.", reasoning={"effort": "medium"})
    assert reasoned.output[0].type == "reasoning"
    assert reasoned.usage.output_tokens_details.reasoning_tokens > 0
    assert reasoned.usage.output_tokens == reasoned.usage.output_tokens_details.reasoning_tokens + len(
        tokenize(reasoned.output_text)
    )
    assert reasoned.reasoning.effort == "medium"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="gpt-4.1", input="x", max_output_tokens=15)
    assert caught.value.param == "max_output_tokens"


def test_metadata_and_echoed_fields(client: openai.OpenAI) -> None:
    response = client.responses.create(model="gpt-4.1", input="x", metadata={"team": "ops"}, temperature=0.2)
    assert response.metadata == {"team": "ops"}
    assert response.temperature == 0.2


# ---- models and apis ----------------------------------------------------------------------------


def test_models_retrieve(client: openai.OpenAI) -> None:
    model = client.models.retrieve("gpt-4.1")
    assert (model.id, model.object, model.owned_by) == ("gpt-4.1", "model", "direct")
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-9")
    assert caught.value.code == "model_not_found"


def test_apis_restrict_what_the_provider_serves() -> None:
    sim = provider(apis={"chat"})
    with sdk(sim) as client:
        assert client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]).choices
        for call in (
            lambda: client.embeddings.create(model="text-embedding-3-small", input="x"),
            lambda: client.completions.create(model="gpt-4.1", prompt="x"),
            lambda: client.responses.create(model="gpt-4.1", input="x"),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                call()
            assert caught.value.body["code"] == "unknown_url"
        assert [m.id for m in client.models.list()] == MODELS
    with pytest.raises(ValueError, match="unknown apis"):
        provider(apis={"chat", "images"})


# ---- faults on the new endpoints ----------------------------------------------------------------

CALLS = {
    "embeddings": lambda c: c.embeddings.create(model="text-embedding-3-small", input="x"),
    "completions": lambda c: c.completions.create(model="gpt-4.1", prompt="x"),
    "responses": lambda c: c.responses.create(model="gpt-4.1", input="x"),
}


@pytest.mark.parametrize("endpoint", sorted(CALLS))
def test_faults_apply_to_every_endpoint(endpoint: str) -> None:
    call = CALLS[endpoint]
    with sdk(provider(FaultSettings(error_rate=1.0))) as client, pytest.raises(openai.InternalServerError):
        call(client)
    with sdk(provider(FaultSettings(rate_limit_rate=1.0, retry_after_s=1.5))) as client:
        with pytest.raises(openai.RateLimitError) as caught:
            call(client)
        assert caught.value.response.headers["retry-after-ms"] == "1500"
    with sdk(provider(FaultSettings(timeout_rate=1.0))) as client, pytest.raises(openai.APITimeoutError):
        call(client)
    with sdk(provider(FaultSettings(reject_cache_hints=True))) as client:
        call(client)
        with pytest.raises(openai.BadRequestError) as caught:
            call(client.with_options(default_headers={"x-session-id": "s1"}))
        assert caught.value.code == "unsupported_cache_hints"


def test_stream_break_drops_a_responses_stream_after_the_first_token() -> None:
    with sdk(provider(FaultSettings(stream_break_rate=1.0))) as client:
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for event in client.responses.create(model="gpt-4.1", input="x", stream=True):
                received.append(event.type)
        assert received[-1] == "response.output_text.delta"
        assert "response.completed" not in received


def test_latency_applies_to_the_new_endpoints() -> None:
    from app.simulator.profiles import LatencyProfile

    sleeps: list[float] = []
    flat = {"default": LatencyProfile(ttft_ms=100, tokens_per_s=50, jitter=0.0)}
    sim = provider(latency_scale=1.0, sleep=sleeps.append, profiles=flat)
    with sdk(sim) as client:
        client.embeddings.create(model="text-embedding-3-small", input="x")
        assert sleeps == [pytest.approx(0.1)]
        sleeps.clear()
        response = client.responses.create(model="gpt-4.1", input="x")
        assert sleeps == [pytest.approx(0.1 + response.usage.output_tokens / 50)]
        sleeps.clear()
        events = list(client.responses.create(model="gpt-4.1", input="x", stream=True))
        deltas = sum(1 for e in events if e.type == "response.output_text.delta")
        assert sleeps == [pytest.approx(0.1)] + [pytest.approx(0.02)] * (deltas - 1)


def test_responses_logprobs_when_included(client: openai.OpenAI) -> None:
    include = ["message.output_text.logprobs"]
    response = client.responses.create(model="gpt-4.1", input="x", include=include, top_logprobs=2)
    part = response.output[0].content[0]
    assert "".join(entry.token for entry in part.logprobs) == part.text
    assert all(len(entry.top_logprobs) == 2 for entry in part.logprobs)
    events = list(client.responses.create(model="gpt-4.1", input="x", include=include, top_logprobs=2, stream=True))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all([entry.token for entry in e.logprobs] == [e.delta] for e in deltas)
    assert client.responses.create(model="gpt-4.1", input="x").output[0].content[0].logprobs == []


def test_async_sdk_through_the_threaded_transport() -> None:
    """The async server's path: AsyncOpenAI over the simulator's transport run in worker threads."""
    import asyncio

    from app.routing.io.async_client import ThreadedTransport

    sim = provider()

    async def run() -> tuple[str, str, list[float]]:
        http = httpx2.AsyncClient(transport=ThreadedTransport(make_transport(sim)))
        async with openai.AsyncOpenAI(
            base_url="http://direct.sim/v1", api_key="sim", max_retries=0, http_client=http
        ) as client:
            stream = await client.responses.create(model="gpt-4.1", input="async", stream=True)
            text = "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])
            whole = await client.responses.create(model="gpt-4.1", input="async")
            vector = await client.embeddings.create(model="text-embedding-3-small", input="async", dimensions=4)
        return text, whole.output_text, vector.data[0].embedding

    text, whole, vector = asyncio.run(run())
    assert text == whole
    assert len(vector) == 4
