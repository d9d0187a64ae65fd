"""The Responses bridge (app/routing/bridge.py), sans I/O: every field of a Responses body is
carried to chat completions, answered by the gateway, or refused by name; what a chat answer holds
(text, logprobs, citations, tool calls, a refusal) comes back as Responses output items, plain and
streamed, each object valid under the official OpenAI schema."""

from __future__ import annotations

import pytest

from app.routing.answers import responses_finish
from app.routing.bridge import EventBridge, NotBridgeable, chat_request, response_body
from core.errors import InvalidRequest
from tests.support.openai_schema import validate

HI = {"input": "hi"}


def entry(token: str, logprob: float, alternatives: tuple[tuple[str, float], ...] = ()) -> dict:
    e = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {**e, "top_logprobs": [entry(t, lp) for t, lp in alternatives]} if alternatives else e


ENTRIES = [entry("Hel", -0.01, (("Hel", -0.01), ("Hi", -4.6))), entry("lo", -0.2, (("lo", -0.2), ("p", -3.0)))]


def chat(message: dict, *, finish: str = "stop", logprobs: dict | None = None) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "up",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish, "logprobs": logprobs}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def chunk(delta: dict, *, finish: str | None = None, logprobs: dict | None = None) -> dict:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}  # fmt: skip


def stream(request: dict, chunks: list[dict]) -> list[dict]:
    bridge = EventBridge(request, "gpt-4.1", now=1_700_000_000.0)
    events = [e for c in chunks for e in bridge.take(c)] + bridge.end()
    for e in events:
        validate("ResponseStreamEvent", e)
    return events


# ------------------------------------------------------------------------------------- the request
def test_an_empty_tools_array_is_no_tools_and_takes_parallel_tool_calls_with_it():
    """The Agents SDK sends ``tools: []`` for every agent without tools; chat refuses an empty array."""
    sent = chat_request({**HI, "tools": [], "parallel_tool_calls": False, "tool_choice": "auto"})
    assert sent == {"messages": [{"role": "user", "content": "hi"}]}


def test_tools_keep_parallel_tool_calls_and_their_choice():
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    sent = chat_request({**HI, "tools": [tool], "parallel_tool_calls": False, "tool_choice": "required"})
    assert sent["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert (sent["parallel_tool_calls"], sent["tool_choice"]) == (False, "required")
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]}
    assert chat_request({**HI, "tools": [tool], "tool_choice": allowed})["tool_choice"] == {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "f"}}]},
    }


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        ({"include": ["message.output_text.logprobs"]}, {"logprobs": True}),
        ({"include": ["message.output_text.logprobs"], "top_logprobs": 3}, {"logprobs": True, "top_logprobs": 3}),
        ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 2}),  # chat refuses top_logprobs alone
        ({"include": []}, {}),
        ({"include": ["reasoning.encrypted_content"]}, {}),  # a bridged answer has no reasoning items
    ],
)
def test_logprobs_are_asked_of_chat_the_way_chat_takes_them(extra, want):
    sent = chat_request({**HI, **extra})
    assert {k: v for k, v in sent.items() if k != "messages"} == want


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"store": True}, "store"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning.summary"),
        ({"include": ["message.output_text.logprobs", "something.new"]}, "include"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"context_management": [{"type": "compaction"}]}, "context_management"),
        ({"a_field_from_next_year": {"x": 1}}, "a_field_from_next_year"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]}, "input"),
    ],
)
def test_what_chat_cannot_carry_is_refused_by_name(body, param):
    with pytest.raises(NotBridgeable) as exc:
        chat_request({**HI, **body})
    assert exc.value.param == param
    assert param.split(".")[0] in str(exc.value) and "Responses API" in str(exc.value)


def test_fields_set_to_nothing_are_not_refused():
    body = {**HI, "conversation": None, "background": False, "store": False, "truncation": "disabled"}
    body.update(previous_response_id=None, max_tool_calls=None, reasoning={"effort": "low", "summary": None})
    assert chat_request(body) == {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}


def test_hostile_shapes_get_clear_errors():
    for body in ({"input": 1e400}, {"input": ["a"]}, {**HI, "include": "x"}, {**HI, "tools": {"a": 1}}):
        with pytest.raises(InvalidRequest):
            chat_request(body)


def test_text_tool_results_in_parts_become_chat_text_parts():
    items = [{"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "3 C"}]}]
    assert chat_request({"input": items})["messages"] == [
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "3 C"}]}
    ]


# ------------------------------------------------------------------------------------ plain answers
def test_a_refusal_becomes_a_refusal_part_and_is_logged_as_one():
    body = response_body(
        chat({"content": None, "refusal": "I can't help with that."}), HI, "gpt-4.1", now=1_700_000_000.0
    )
    validate("Response", body)
    (item,) = body["output"]
    assert item["type"] == "message" and item["content"] == [{"type": "refusal", "refusal": "I can't help with that."}]
    assert body["status"] == "completed" and responses_finish(body) == "refusal"


def test_logprobs_and_citations_come_back_in_the_output_text():
    cite = {"type": "url_citation", "url_citation": {"url": "https://e.x/a", "title": "A", "start_index": 0,
                                                     "end_index": 5}}  # fmt: skip
    answer = chat({"content": "Hello", "annotations": [cite]}, logprobs={"content": ENTRIES, "refusal": None})
    body = response_body(answer, {**HI, "top_logprobs": 2}, "gpt-4.1", now=1_700_000_000.0)
    validate("Response", body)
    (part,) = body["output"][0]["content"]
    assert part["logprobs"] == ENTRIES and body["top_logprobs"] == 2
    assert part["annotations"] == [{"type": "url_citation", "url": "https://e.x/a", "title": "A", "start_index": 0,
                                    "end_index": 5}]  # fmt: skip
    assert responses_finish(body) == "completed"


# ---------------------------------------------------------------------------------------- streamed
def test_a_streamed_refusal_becomes_the_refusal_events():
    events = stream(HI, [chunk({"role": "assistant", "content": None, "refusal": None}),
                         chunk({"refusal": "I can't "}), chunk({"refusal": "do that."}),
                         chunk({}, finish="stop")])  # fmt: skip
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.refusal.delta",
        "response.refusal.delta",
        "response.refusal.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[3]["part"] == {"type": "refusal", "refusal": ""}
    assert events[6]["refusal"] == "I can't do that."
    final = events[-1]["response"]
    assert final["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't do that."}]
    assert responses_finish(final) == "refusal"


def test_streamed_logprobs_ride_on_each_delta_and_the_final_part():
    events = stream({**HI, "top_logprobs": 2}, [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}, logprobs={"content": ENTRIES[:1], "refusal": None}),
        chunk({"content": "lo"}, logprobs={"content": ENTRIES[1:], "refusal": None}),
        chunk({}, finish="stop"),
    ])  # fmt: skip
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"] for d in deltas] == [ENTRIES[:1], ENTRIES[1:]]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["text"] == "Hello" and done["logprobs"] == ENTRIES
    assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == ENTRIES


def test_text_then_refusal_are_two_parts_of_one_message_then_the_tool_call():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    events = stream(HI, [chunk({"content": "Well."}), chunk({"refusal": "No."}), chunk({"tool_calls": [call]}),
                         chunk({}, finish="tool_calls")])  # fmt: skip
    parts = [(e["content_index"], e["part"]["type"]) for e in events if e["type"] == "response.content_part.added"]
    assert parts == [(0, "output_text"), (1, "refusal")]
    (refusal_delta,) = [e for e in events if e["type"] == "response.refusal.delta"]
    assert (refusal_delta["output_index"], refusal_delta["content_index"]) == (0, 1)
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["message", "function_call"]
    assert [p["type"] for p in output[0]["content"]] == ["output_text", "refusal"]
    assert output[1]["arguments"] == '{"a":1}' and output[1]["call_id"] == "call_1"
