"""What the canary analysis judges an answer by (core/quality.py), and that every attempt records it:
pure cases (hostile ones included), then real answers through the routing client, streamed or not."""

from __future__ import annotations

import json

import httpx2
import pytest
from sqlalchemy import select

from core.quality import AnswerQuality, bad_tool_json, chat_quality, requested_schema, schema_violated
from db.models import RequestLog

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
ASK = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}}


def _answer(content=None, *, refusal=None, tool_calls=None, finish="stop") -> dict:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def _call(args: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}


@pytest.mark.parametrize(
    ("answer", "request_body", "expected"),
    [
        (_answer("hi"), {}, AnswerQuality()),
        (_answer(None, refusal="I can't help with that"), {}, AnswerQuality(refused=True)),
        (_answer("", finish="content_filter"), {}, AnswerQuality(refused=True)),
        (_answer(None, tool_calls=[_call('{"a": 1}'), _call('{"a": '), _call("nan]")]), {},
         AnswerQuality(tool_json_bad=2)),
        (_answer('{"n": 3}'), ASK, AnswerQuality(schema_bad=False)),
        (_answer('{"n": "three"}'), ASK, AnswerQuality(schema_bad=True)),
        (_answer("not json at all"), ASK, AnswerQuality(schema_bad=True)),
        (_answer(None, tool_calls=[_call("{}")]), ASK, AnswerQuality()),  # answered with a tool: not judged
        (_answer(None, refusal="no"), ASK, AnswerQuality(refused=True)),  # a refusal is counted once, as one
        ({"choices": "garbage"}, ASK, AnswerQuality(schema_bad=True)),
        ({}, {}, AnswerQuality()),
    ],
)  # fmt: skip
def test_chat_quality(answer, request_body, expected) -> None:
    assert chat_quality(answer, request_body) == expected


def test_hostile_inputs_never_raise() -> None:
    deep = "[" * 100_000
    assert schema_violated(deep, SCHEMA) is True
    assert bad_tool_json([_call(deep), "x", None, {"function": "x"}, {"function": {"arguments": 3}}]) == 1
    assert schema_violated('{"n": 1}', {"type": "no-such-type"}) is None  # an unusable schema is not judged
    assert schema_violated('{"n": 1}', {"minimum": float("nan")}) is None
    assert requested_schema({"response_format": {"type": "json_schema", "json_schema": "x"}}) is None
    assert requested_schema({"response_format": "json_object"}) is None


# -- recorded per attempt, through the routing client --------------------------------------------------


def _rows(client) -> list:
    client.flush()
    with client.engine.connect() as conn:
        return conn.execute(
            select(RequestLog.refused, RequestLog.tool_json_bad, RequestLog.schema_bad, RequestLog.chunk_gap_ms,
                   RequestLog.stream).order_by(RequestLog.id)
        ).all()  # fmt: skip


def _sse(*chunks: dict) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _chunk(delta: dict, finish=None) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip


def test_every_attempt_records_its_answer_quality(client_factory, sqlite_url) -> None:
    answers = iter(
        [
            httpx2.Response(200, json={**_answer(None, refusal="no"), "usage": {"prompt_tokens": 1}}),
            httpx2.Response(200, json=_answer(None, tool_calls=[_call('{"a":')], finish="tool_calls")),
            httpx2.Response(200, json=_answer('{"n": "x"}')),
            httpx2.Response(
                200,
                content=_sse(
                    _chunk({"role": "assistant", "content": "a"}),
                    _chunk({"content": "b"}),
                    _chunk({"content": "c"}),
                    _chunk({}, "stop"),
                ),
                headers={"content-type": "text/event-stream"},
            ),
            httpx2.Response(
                200,
                content=_sse(_chunk({"role": "assistant", "refusal": "I won't"}), _chunk({}, "stop")),
                headers={"content-type": "text/event-stream"},
            ),
        ]
    )
    client = client_factory(sqlite_url, transports={"direct": httpx2.MockTransport(lambda r: next(answers))})
    msg = [{"role": "user", "content": "hi"}]
    client.chat(msg, route="fallback")
    client.chat(msg, route="fallback", tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    client.chat(msg, route="fallback", **ASK)
    list(client.chat(msg, route="fallback", stream=True))
    list(client.chat(msg, route="fallback", stream=True))
    rows = _rows(client)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (True, 0, None),
        (False, 1, None),
        (False, 0, True),
        (False, 0, None),
        (True, 0, None),
    ]
    assert [r[3] is not None for r in rows] == [False, False, False, True, True]  # streams only
    assert rows[3][3] >= 0
