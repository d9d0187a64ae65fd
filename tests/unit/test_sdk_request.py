"""Both drivers send each upstream exactly what the openai SDK's ``chat.completions.create`` sends.

They call the SDK's ``client.post`` with a body they build (``RoutingClient._request``), skipping
only ``create``'s parameter transform, which costs 0.3 ms a call. These tests hold that shortcut to
the SDK: the same JSON body and the same headers as ``create`` for the same parameters, streamed or
not, with and without cache hints; and the transform is the identity on every body we can build.
"""

from __future__ import annotations

import asyncio
import json

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._utils import maybe_transform
from openai.types.chat import completion_create_params

from app.routing.async_client import AsyncRoutingClient
from app.routing.client import VALID_ROLES
from db.canary import set_ratio
from tests.support.examples import examples
from tests.unit.test_fallback import chunk, completion, sse

MODEL = "gemini-2.5-flash"
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "héllo \U0001f600"}]},
    {"role": "assistant", "content": "hi"},
    {"role": "user", "content": "and again"},
]
# Headers that differ between any two SDK calls (the SDK's own per-call values).
PER_CALL = {"x-stainless-retry-count", "x-stainless-read-timeout", "content-length"}


def answer(request: httpx2.Request) -> httpx2.Response:
    if json.loads(request.content).get("stream"):
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        body = sse([chunk("ok"), chunk(finish="stop"), chunk(usage=usage)])
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})
    return httpx2.Response(200, json=completion())


@pytest.fixture
def routed(client_factory, sqlite_url):
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer(request)

    client = client_factory(sqlite_url, transports={"holysheep": httpx2.MockTransport(handler)})
    set_ratio(client.engine, 1.0, expected_version=None, actor="test", reason="all to primary")
    client.refresh()
    return client, seen


def sent(request: httpx2.Request) -> tuple[dict, dict]:
    headers = {k.lower(): v for k, v in request.headers.items() if k.lower() not in PER_CALL}
    return json.loads(request.content), headers


def through_create(client, *, stream: bool, hints: dict | None, **params) -> None:
    sdk = client._client("holysheep")
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    got = sdk.chat.completions.create(model=MODEL, messages=MESSAGES, extra_headers=hints, **params, **extra)
    if stream:
        list(got)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("chat", "params"),
    [
        ({}, {}),
        ({"max_tokens": 7, "temperature": 0.5}, {"max_tokens": 7, "temperature": 0.5}),
        ({"session_id": "세션-7"}, {}),
    ],
)
def test_both_drivers_send_what_create_sends(routed, stream, chat, params):
    client, seen = routed
    result = client.chat(MESSAGES, MODEL, stream=stream, **chat)
    if stream:
        assert "".join(result) == "ok"
    ours = sent(seen[-1])

    hints = seen[-1].headers.get("x-session-id")
    extra = {"x-session-id": hints, "x-cache-controls": "session_scope"} if hints else None
    through_create(client, stream=stream, hints=extra, **params)
    theirs = sent(seen[-1])

    async def via_async() -> tuple[tuple[dict, dict], tuple[dict, dict]]:
        async with AsyncRoutingClient(client) as driver:
            if stream:
                assert "".join([p async for p in driver.chat_stream(MESSAGES, MODEL, **chat)]) == "ok"
            else:
                assert (await driver.chat(MESSAGES, MODEL, **chat)).text
            ours_async = sent(seen[-1])
            sdk = driver._client("holysheep")
            more = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            got = await sdk.chat.completions.create(
                model=MODEL, messages=MESSAGES, extra_headers=extra, **params, **more
            )
            if stream:
                [c async for c in got]
            return ours_async, sent(seen[-1])

    ours_async, theirs_async = asyncio.run(via_async())
    assert ours[0] == theirs[0] == ours_async[0] == theirs_async[0]  # the same JSON body
    assert ours[1] == theirs[1]  # the same headers, key and session hints included
    assert ours_async[1] == theirs_async[1]
    assert ours[1]["authorization"].startswith("Bearer ")
    assert ("x-session-id" in ours[1]) == ("session_id" in chat)


texts = st.text(max_size=40)
parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), min_size=1, max_size=3)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(sorted(VALID_ROLES)), "content": texts | parts}),
    min_size=1,
    max_size=4,
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    msgs=messages,
    stream=st.booleans(),
    max_tokens=st.none() | st.integers(1, 10**6),
    temperature=st.none() | st.floats(0, 2),
)
def test_the_sdk_transform_is_the_identity_on_every_body_we_build(routed, msgs, stream, max_tokens, temperature):
    client, _ = routed
    params = {k: v for k, v in {"temperature": temperature, "max_tokens": max_tokens}.items() if v is not None}
    plan = client.core.plan("chat", {"messages": msgs, **params}, model=MODEL, stream=stream)
    attempt = next(client.core.attempts(plan))
    _, body, _ = client.core.request(plan, attempt)
    shape = (
        completion_create_params.CompletionCreateParamsStreaming
        if stream
        else completion_create_params.CompletionCreateParamsNonStreaming
    )
    assert maybe_transform(body, shape) == body
