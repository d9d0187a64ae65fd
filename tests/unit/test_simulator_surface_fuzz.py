"""Hostile bodies on every simulator endpoint: whatever JSON arrives, the answer is a 200 or an
OpenAI-shaped 4xx error, never an exception or a 500."""

from __future__ import annotations

import json

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.simulator import SimulatedProvider, make_transport
from tests.support.examples import examples

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
