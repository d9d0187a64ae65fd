"""The simulator through the real openai SDK over the mock transport: answers, usage, prefix
caching, every fault mode and the latency model."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.simulator import PrefixCache, SimulatedProvider, make_transport
from app.simulator.profiles import LatencyProfile
from app.simulator.tokens import tokenize
from core.faults import FaultSettings
from tests.support.examples import examples

MODELS = ["deepseek-chat-v3.2", "gpt-4.1"]
HELLO = [{"role": "user", "content": "Explain prefix caching in one paragraph, please."}]


def provider(faults: FaultSettings | None = None, **kwargs) -> SimulatedProvider:
    settings = faults or FaultSettings()
    kwargs.setdefault("latency_scale", 0)
    kwargs.setdefault("seed", 7)
    return SimulatedProvider("holysheep", MODELS, faults=lambda: settings, **kwargs)


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


def test_non_streamed_completion_with_usage(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=HELLO, temperature=0.3)
    reply = raw.parse()
    text = reply.choices[0].message.content
    assert text.startswith("[simulated holysheep/gpt-4.1] This is a simulated answer")
    assert '"Explain prefix caching in one paragraph, please."' in text
    assert reply.id.startswith("chatcmpl-sim-")
    assert reply.object == "chat.completion"
    assert reply.model == "gpt-4.1"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len(tokenize(text))
    assert 40 <= reply.usage.completion_tokens <= 160
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 0
    assert raw.headers["x-request-id"].startswith("req-sim-")


def test_request_id_is_echoed(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=HELLO, extra_headers={"x-request-id": "abc-123"}
    )
    assert raw.headers["x-request-id"] == "abc-123"
    assert raw.parse()._request_id == "abc-123"


def test_same_prompt_same_answer(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    second = client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert first.choices[0].message.content == second.choices[0].message.content


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_cuts_the_answer(client: openai.OpenAI, param: str) -> None:
    reply = client.chat.completions.create(model="gpt-4.1", messages=HELLO, **{param: 7})
    assert reply.usage.completion_tokens == 7 == len(tokenize(reply.choices[0].message.content))
    assert reply.choices[0].finish_reason == "length"


def test_streamed_completion_with_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="gpt-4.1", messages=HELLO).choices[0].message.content
    stream = client.chat.completions.create(
        model="gpt-4.1", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id.startswith("chatcmpl-sim-") for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) == len(tokenize(text))  # one event per token
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == len(tokenize(text))
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens > 0  # the same prompt ran just before


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True, max_tokens=5))
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "[simulated holy"  # [ simu late d holy


def test_a_grown_conversation_hits_the_prefix_cache() -> None:
    cache = PrefixCache(block_tokens=16)
    sim = provider(prefix_cache=cache)
    conversation = [
        {"role": "system", "content": "You are a concise assistant for operators of an LLM gateway."},
        {"role": "user", "content": "How do sticky sessions help the prefix cache of an upstream?"},
    ]
    with sdk(sim) as client:
        first = client.chat.completions.create(model="gpt-4.1", messages=conversation)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        conversation += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And what happens on a cache miss?"},
        ]
        second = client.chat.completions.create(model="gpt-4.1", messages=conversation)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    assert cached % 16 == 0
    assert cached == first.usage.prompt_tokens // 16 * 16
    assert cached <= second.usage.prompt_tokens


def test_each_provider_has_its_own_cache() -> None:
    def cached(client: openai.OpenAI) -> int:
        return client.chat.completions.create(model="gpt-4.1", messages=HELLO).usage.prompt_tokens_details.cached_tokens

    with sdk(provider()) as one, sdk(provider()) as other:
        cached(one)
        assert cached(other) == 0
        assert cached(one) > 0


# ---- errors -----------------------------------------------------------------------------


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-9", messages=HELLO)
    assert caught.value.status_code == 404
    assert caught.value.code == "model_not_found"
    assert caught.value.message.endswith("The model `gpt-9` does not exist or you do not have access to it.")


@pytest.mark.parametrize(
    "extra",
    [
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"content": "no role"}]},
        {"max_tokens": 0},
        {"temperature": 7},
    ],
)
def test_invalid_bodies_are_400(client: openai.OpenAI, extra: dict) -> None:
    body = {"model": "gpt-4.1", "messages": HELLO, **extra}
    with pytest.raises(openai.BadRequestError):
        client.post("/chat/completions", body=body, cast_to=object)


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models] == MODELS
    assert {m.owned_by for m in models} == {"holysheep"}


def test_unknown_path_is_404_json(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.images.generate(model="gpt-4.1", prompt="x")
    assert caught.value.body["code"] == "unknown_url"


def test_authorization_is_not_needed() -> None:
    sim = provider()
    response = httpx2.Client(transport=make_transport(sim)).get("http://holysheep.sim/v1/models")
    assert response.status_code == 200


# ---- faults through the SDK -------------------------------------------------------------


def test_error_fault_is_internal_server_error() -> None:
    with sdk(provider(FaultSettings(error_rate=1.0))) as client, pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert caught.value.status_code == 500
    assert caught.value.response.headers["x-request-id"]


def test_rate_limit_fault_is_rate_limit_error_with_retry_after() -> None:
    sim = provider(FaultSettings(rate_limit_rate=1.0, retry_after_s=2.5))
    with sdk(sim) as client, pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    headers = caught.value.response.headers
    assert headers["retry-after"] == "3"
    assert headers["retry-after-ms"] == "2500"
    assert caught.value.code == "rate_limit_exceeded"


def test_timeout_fault_is_api_timeout_error_after_the_client_timeout() -> None:
    sleeps: list[float] = []
    sim = provider(FaultSettings(timeout_rate=1.0), latency_scale=1.0, sleep=sleeps.append)
    with sdk(sim, timeout=2.5) as client, pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert sleeps == [2.5]


def test_timeout_fault_never_sleeps_at_latency_scale_zero() -> None:
    sleeps: list[float] = []
    sim = provider(FaultSettings(timeout_rate=1.0), sleep=sleeps.append)
    with sdk(sim) as client, pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert sleeps == []


def test_reject_cache_hints_only_when_hint_headers_are_present() -> None:
    with sdk(provider(FaultSettings(reject_cache_hints=True))) as client:
        assert client.chat.completions.create(model="gpt-4.1", messages=HELLO).choices
        for header in ("x-session-id", "x-cache-controls"):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model="gpt-4.1", messages=HELLO, extra_headers={header: "s1"})
            assert caught.value.code == "unsupported_cache_hints"
            assert caught.value.body["message"] == f"unsupported header: {header} (cache hints)"
    with sdk(provider()) as client:  # hints are fine when the fault is off
        client.chat.completions.create(model="gpt-4.1", messages=HELLO, extra_headers={"x-session-id": "s1"})


def test_stream_break_raises_mid_iteration_after_the_first_chunk() -> None:
    """Through openai 3.51 a broken stream surfaces as ``openai.APIConnectionError`` raised by
    the iteration (the SDK maps transport errors while reading events), caused by the
    ``httpx2.RemoteProtocolError`` the byte stream raised, after the role and first content chunk."""
    with sdk(provider(FaultSettings(stream_break_rate=1.0))) as client:
        stream = client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True)
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError) as caught:
            for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        assert isinstance(caught.value.__cause__, httpx2.RemoteProtocolError)
        assert received == ["", "["]
        # Non-streamed requests are unaffected by this fault.
        assert client.chat.completions.create(model="gpt-4.1", messages=HELLO).choices[0].message.content


def test_faults_are_read_once_per_request_so_runtime_changes_apply() -> None:
    current = {"settings": FaultSettings()}
    reads: list[int] = []

    def faults() -> FaultSettings:
        reads.append(1)
        return current["settings"]

    sim = SimulatedProvider("holysheep", MODELS, faults=faults, latency_scale=0, seed=1)
    with sdk(sim) as client:
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        current["settings"] = FaultSettings(error_rate=1.0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="gpt-4.1", messages=HELLO)
    assert len(reads) == 2


def fault_outcomes(settings: FaultSettings, requests: int, seed: int) -> dict[str, int]:
    handle = provider(settings, seed=seed).handle
    outcomes = {"ok": 0, "timeout": 0, 429: 0, 500: 0}
    body = b'{"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}'
    for _ in range(requests):
        request = httpx2.Request("POST", "http://holysheep.sim/v1/chat/completions", content=body)
        try:
            status = handle(request).status_code
        except httpx2.ReadTimeout:
            outcomes["timeout"] += 1
            continue
        outcomes["ok" if status == 200 else status] += 1
    return outcomes


def test_a_seed_repeats_the_fault_sequence() -> None:
    settings = FaultSettings(error_rate=0.3)
    assert fault_outcomes(settings, 200, seed=11) == fault_outcomes(settings, 200, seed=11)


# ---- latency ----------------------------------------------------------------------------

FLAT = {"default": LatencyProfile(ttft_ms=200, tokens_per_s=100, jitter=0.0)}


def recorded_sleeps(multiplier: float, *, stream: bool, profiles=FLAT) -> tuple[list[float], int]:
    sleeps: list[float] = []
    sim = provider(
        FaultSettings(latency_multiplier=multiplier), latency_scale=1.0, sleep=sleeps.append, profiles=profiles
    )
    with sdk(sim) as client:
        if stream:
            chunks = list(client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True))
            tokens = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
        else:
            tokens = client.chat.completions.create(model="gpt-4.1", messages=HELLO).usage.completion_tokens
    return sleeps, tokens


@pytest.mark.parametrize("multiplier", [1.0, 3.0])
def test_non_streamed_latency_is_ttft_plus_generation_scaled(multiplier: float) -> None:
    sleeps, tokens = recorded_sleeps(multiplier, stream=False)
    assert sleeps == [pytest.approx((0.2 + tokens / 100) * multiplier)]


@pytest.mark.parametrize("multiplier", [1.0, 0.5])
def test_streamed_latency_is_ttft_then_per_token(multiplier: float) -> None:
    sleeps, tokens = recorded_sleeps(multiplier, stream=True)
    assert sleeps[0] == pytest.approx(0.2 * multiplier)
    assert sleeps[1:] == [pytest.approx(0.01 * multiplier)] * (tokens - 1)


def test_latency_scale_zero_never_sleeps() -> None:
    sleeps: list[float] = []
    sim = provider(FaultSettings(latency_multiplier=5.0), sleep=sleeps.append)
    with sdk(sim) as client:
        client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        list(client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True))
    assert sleeps == []


def test_many_threads_share_one_provider() -> None:
    sim = provider(FaultSettings(error_rate=0.5), seed=5)

    def outcome(i: int) -> str:
        try:
            with sdk(sim) as client:
                client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": f"q{i}"}])
            return "ok"
        except openai.InternalServerError:
            return "500"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(outcome, range(200)))
    assert 50 < results.count("500") < 150


# -- simulator surface fuzz ------------------------------------------------------------------------
# Hostile bodies on every simulator endpoint: whatever JSON arrives, the answer is a 200 or an
# OpenAI-shaped 4xx error, never an exception or a 500.


SIM = SimulatedProvider("fuzz", ["gpt-4.1"], latency_scale=0, seed=1)
HTTP = httpx2.Client(transport=make_transport(SIM))

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
TOOLISH = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "custom", 3])},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g_1", "bad name", 5])}, optional={"parameters": JSON}
        ),
        "name": st.sampled_from(["f", "g_1", 7]),
        "parameters": JSON,
    },
)
USER = st.just([{"role": "user", "content": "weather in Paris, call f please"}])
TEXT = st.just("call the tool f for Paris")


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """Usually a valid value, so the other fields' checks are reached too."""
    return st.one_of(valid, valid, valid, hostile)


FIELDS = {
    "/v1/chat/completions": {
        "messages": mostly(
            USER,
            st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "assistant", "tool", "system", "x"])},
                    optional={"content": JSON, "tool_calls": JSON, "tool_call_id": JSON},
                ),
                max_size=3,
            ),
        ),
        "tools": st.one_of(JSON, st.lists(TOOLISH, max_size=3)),
        "tool_choice": JSON,
        "response_format": st.one_of(
            JSON,
            st.fixed_dictionaries(
                {
                    "type": st.just("json_schema"),
                    "json_schema": st.fixed_dictionaries({"name": st.just("x"), "schema": JSON}),
                }
            ),
        ),
        "n": JSON,
        "stop": JSON,
        "logprobs": JSON,
        "top_logprobs": JSON,
        "stream": st.booleans(),
        "max_tokens": JSON,
        "reasoning_effort": JSON,
    },
    "/v1/responses": {
        "input": mostly(
            TEXT,
            st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning"])},
                    optional={
                        "role": JSON,
                        "content": JSON,
                        "call_id": JSON,
                        "name": JSON,
                        "arguments": JSON,
                        "output": JSON,
                    },
                ),
                max_size=3,
            ),
        ),
        "instructions": JSON,
        "tools": st.one_of(JSON, st.lists(TOOLISH, max_size=3)),
        "tool_choice": JSON,
        "text": JSON,
        "previous_response_id": JSON,
        "max_output_tokens": JSON,
        "reasoning": JSON,
        "stream": st.booleans(),
        "metadata": JSON,
    },
    "/v1/embeddings": {"input": mostly(TEXT, JSON), "dimensions": JSON, "encoding_format": JSON},
    "/v1/completions": {
        "prompt": JSON,
        "n": JSON,
        "logprobs": JSON,
        "echo": JSON,
        "stop": JSON,
        "stream": st.booleans(),
    },
}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict]:
    path = draw(st.sampled_from(sorted(FIELDS)))
    required = {"/v1/chat/completions": "messages", "/v1/responses": "input"}.get(
        path, "input" if "embeddings" in path else "prompt"
    )
    optional = {k: v for k, v in FIELDS[path].items() if k != required}
    body = draw(st.fixed_dictionaries({required: FIELDS[path][required]}, optional=optional))
    body["model"] = draw(st.sampled_from(["gpt-4.1"] * 6 + ["nope", 1]))
    return path, body


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_any_body_gets_an_answer_or_an_openai_error(request: tuple[str, dict]) -> None:
    path, body = request
    response = HTTP.post(f"http://fuzz.sim{path}", content=json.dumps(body).encode())
    response.read()
    assert response.status_code in (200, 400, 404), response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["type"] == "invalid_request_error"
