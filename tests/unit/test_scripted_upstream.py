"""The scripted upstream's valid answers (tests/support/chaos_upstream.py): any JSON answer with
status and headers, SSE streams (plain and with named events), the usage chunk only when asked,
every path served and recorded, and every builder shaped as the official OpenAI schema says."""

from __future__ import annotations

import threading

import httpx2
import pytest

from tests.support.chaos_upstream import (
    ChaosUpstream,
    chat_body,
    embeddings_body,
    function_call_item,
    interleaved_chunks,
    logprobs_body,
    message_item,
    model_body,
    models_body,
    openai_like,
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
from tests.support.openai_schema import SchemaError, validate
from tests.support.wire_tap import WireTap, parse_sse, validate_exchange

M = "gpt-4.1"
CALLS = [tool_call("call_1", "get_weather", {"city": "Paris"}), tool_call("call_2", "get_time", {"tz": "CET"})]


@pytest.fixture
def up():
    before = set(threading.enumerate())
    with ChaosUpstream() as server:
        yield server
    assert set(threading.enumerate()) <= before


def post(up, path, body, **kw):
    return httpx2.post(f"{up.url}{path}", json=body, timeout=5, **kw)


def test_reply_any_body_status_and_headers(up):
    up.script(reply({"anything": [1, None]}, status=418, headers={"x-ratelimit-remaining-requests": "7"}), provider="p")
    r = post(up, "/p/v1/whatever", {"x": 1}, headers={"x-custom": "c"})
    assert r.status_code == 418 and r.json() == {"anything": [1, None]}
    assert r.headers["x-ratelimit-remaining-requests"] == "7"
    rec = up.requests_for("p")[0]
    assert (rec.method, rec.path, rec.provider, rec.json) == ("POST", "/p/v1/whatever", "p", {"x": 1})
    assert rec.headers["x-custom"] == "c" and rec.fault == "reply"


def test_reply_body_can_depend_on_the_request(up):
    up.script(reply(lambda req: {"echo": req.json["v"]}))
    assert post(up, "/v1/chat/completions", {"v": 42}).json() == {"echo": 42}


def test_sse_chunks_in_order_and_done(up):
    chunks = text_chunks(M, "a b c")
    up.script(sse(chunks, headers={"openai-processing-ms": "12"}))
    r = post(up, "/v1/chat/completions", {"stream": True})
    assert r.headers["content-type"] == "text/event-stream" and r.headers["openai-processing-ms"] == "12"
    events = parse_sse(r.content)
    assert events[-1] == (None, "[DONE]")
    # Not asked for: the usage-only chunk is withheld, as OpenAI does.
    assert [d for _, d in events[:-1]] == [c for c in chunks if c["choices"]]


def test_sse_usage_chunk_when_asked(up):
    chunks = text_chunks(M, "a b")
    up.script(sse(chunks))
    r = post(up, "/v1/chat/completions", {"stream": True, "stream_options": {"include_usage": True}})
    assert [d for _, d in parse_sse(r.content)[:-1]] == chunks


def test_sse_named_events_have_no_done(up):
    events = response_events(M, "hi there")
    up.script(sse(events, named=True))
    got = parse_sse(post(up, "/v1/responses", {"stream": True}).content)
    assert got == [(e["type"], e) for e in events]


def test_openai_like_answers_each_endpoint_validly(up):
    up.set_default(openai_like())
    cases = [
        ("POST", "/d/v1/chat/completions", {"model": M, "messages": []}),
        ("POST", "/d/v1/chat/completions", {"model": M, "messages": [], "stream": True}),
        ("POST", "/d/v1/responses", {"model": M, "input": "x"}),
        ("POST", "/d/v1/responses", {"model": M, "input": "x", "stream": True}),
        ("POST", "/d/v1/embeddings", {"model": "e", "input": ["a", "b", "c"]}),
        ("POST", "/d/v1/completions", {"model": M, "prompt": "x"}),
        ("GET", "/d/v1/models", None),
        ("GET", "/d/v1/models/gpt-4.1", None),
    ]
    for method, path, body in cases:
        r = httpx2.request(method, f"{up.url}{path}", json=body, timeout=5)
        assert r.status_code == 200, path
        assert validate_exchange(method, path, 200, r.headers["content-type"], r.content) >= 1
    assert len(httpx2.post(f"{up.url}/d/v1/embeddings", json={"input": ["a", "b", "c"]}).json()["data"]) == 3
    assert httpx2.get(f"{up.url}/d/v1/models/gpt-4.1").json()["id"] == "gpt-4.1"
    assert [r.path for r in up.requests_for("d")][:2] == ["/d/v1/chat/completions"] * 2


def test_builders_are_schema_valid():
    for body in (
        chat_body(M),
        tool_call_body(M, CALLS),
        refusal_body(M),
        logprobs_body(M),
        chat_body(M, usage_=usage(10, 200, cached=5, reasoning=128)),
    ):
        validate("CreateChatCompletionResponse", body)
    for chunk in text_chunks(M) + tool_call_chunks(M, CALLS) + interleaved_chunks(M, ["a b c", "d e"]):
        validate("CreateChatCompletionStreamResponse", chunk)
    validate("CreateEmbeddingResponse", embeddings_body("e", [[0.1, 0.2]]))
    validate("CreateCompletionResponse", text_completion_body(M, ["x", "y"]))
    validate("Model", model_body(M))
    validate("ListModelsResponse", models_body([M, "e"]))
    items = [message_item("hi there"), function_call_item("call_9", "f", {"a": 1})]
    validate("Response", response_body(M, items))
    for event in response_events(M, items):
        validate("ResponseStreamEvent", event)


def test_tool_call_chunks_stream_the_call_as_openai_does():
    chunks = tool_call_chunks(M, CALLS, fragments=3)
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    heads = [d for d in deltas if "id" in d]
    assert [(d["index"], d["id"], d["function"]["name"], d["function"]["arguments"]) for d in heads] == [
        (0, "call_1", "get_weather", ""),
        (1, "call_2", "get_time", ""),
    ]
    for i, call in enumerate(CALLS):
        frags = [d["function"]["arguments"] for d in deltas if d["index"] == i and "id" not in d]
        assert len(frags) > 1 and "".join(frags) == call["function"]["arguments"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["choices"] == []


def test_interleaved_chunks_alternate_indexes():
    chunks = interleaved_chunks(M, ["a b", "c d"])
    content = [(c["choices"][0]["index"], c["choices"][0]["delta"].get("content")) for c in chunks if c["choices"]]
    assert content[2:6] == [(0, "a"), (1, "c"), (0, " b"), (1, " d")]


def test_response_events_reassemble_the_final_response():
    items = [message_item("one two"), function_call_item("call_9", "f", {"a": 1})]
    events = response_events(M, items)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert (text, args) == ("one two", '{"a": 1}')
    assert events[-1]["response"]["output"] == items


def test_wire_tap_records_and_validates_what_a_client_read(up):
    tap = WireTap()
    up.script(reply(chat_body(M)), sse(text_chunks(M, "x y")), reply({**chat_body(M), "system_fingerprint": None}))
    with tap.client() as client:
        client.post(f"{up.base_url()}/chat/completions", json={"model": M})
        with client.stream("POST", f"{up.base_url()}/chat/completions", json={"model": M, "stream": True}) as r:
            assert b"".join(r.iter_bytes()).endswith(b"data: [DONE]\n\n")
        assert [ex.sent_json for ex in tap.exchanges] == [{"model": M}, {"model": M, "stream": True}]
        assert tap.validate_all() == 1 + 4  # the completion; role, two words, finish (no usage: not asked)
        client.post(f"{up.base_url()}/chat/completions", json={"model": M})
    with pytest.raises(SchemaError, match=r"POST /v1/chat/completions -> 200: .*\$\.system_fingerprint"):
        tap.validate_all()
