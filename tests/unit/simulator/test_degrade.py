"""The simulator's answer-quality faults through the real openai SDK over the mock transport: each
fault at 100 % makes every answer that bad (streamed or not), at 0 % none; the quality judge
(core/quality.py) sees exactly what each fault breaks."""

from __future__ import annotations

import json

import pytest

from app.simulator.degrade import degrade
from app.simulator.generation import Reply, ToolCall
from core.faults import FaultSettings
from core.quality import chat_quality
from tests.unit.simulator.test_server import HELLO, provider, sdk

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
SCHEMA_ASK = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}}, "required": ["q"]}}}]  # fmt: skip


def _ask(faults: FaultSettings, **kw):
    with sdk(provider(faults)) as client:
        return client.chat.completions.create(model="gpt-4.1", messages=HELLO, **kw)


def _quality(completion, request: dict):
    return chat_quality(completion.model_dump(), request)


def test_no_fault_no_change() -> None:
    healthy = _ask(FaultSettings())
    assert healthy.choices[0].finish_reason == "stop" and healthy.choices[0].message.content
    assert _quality(healthy, {}) == chat_quality({"choices": [{"message": {"content": "x"}}]}, {})


def test_refusals() -> None:
    r = _ask(FaultSettings(refusal_rate=1.0))
    assert r.choices[0].finish_reason == "content_filter" and not r.choices[0].message.content
    assert _quality(r, {}).refused


def test_truncations_and_empty_answers() -> None:
    whole = _ask(FaultSettings()).choices[0].message.content
    cut = _ask(FaultSettings(truncation_rate=1.0))
    assert cut.choices[0].finish_reason == "length" and whole.startswith(cut.choices[0].message.content)
    assert len(cut.choices[0].message.content) < len(whole)
    empty = _ask(FaultSettings(empty_rate=1.0))
    assert empty.choices[0].message.content in ("", None) and empty.usage.completion_tokens == 0


def test_broken_tool_json() -> None:
    ok = _ask(FaultSettings(), tools=TOOLS, tool_choice="required")
    json.loads(ok.choices[0].message.tool_calls[0].function.arguments)
    bad = _ask(FaultSettings(tool_json_break_rate=1.0), tools=TOOLS, tool_choice="required")
    assert _quality(bad, {}).tool_json_bad == len(bad.choices[0].message.tool_calls) >= 1


def test_schema_violations() -> None:
    request = {"response_format": SCHEMA_ASK}
    assert _quality(_ask(FaultSettings(), response_format=SCHEMA_ASK), request).schema_bad is False
    assert _quality(_ask(FaultSettings(schema_violation_rate=1.0), response_format=SCHEMA_ASK), request).schema_bad


def test_verbosity_multiplies_the_answer_and_its_tokens() -> None:
    plain, wordy = _ask(FaultSettings()), _ask(FaultSettings(verbosity_multiplier=3))
    assert wordy.choices[0].message.content.count(plain.choices[0].message.content) == 3
    assert wordy.usage.completion_tokens >= 3 * plain.usage.completion_tokens - 2


def test_streams_are_degraded_the_same_way() -> None:
    with sdk(provider(FaultSettings(truncation_rate=1.0))) as client:
        chunks = list(client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_ttft_multiplier_scales_only_the_first_token() -> None:
    sim = provider(latency_scale=1.0)
    draws = sim._draw()
    base = sim._pace("gpt-4.1", FaultSettings(), draws)
    slow = sim._pace("gpt-4.1", FaultSettings(ttft_multiplier=2.0), draws)
    assert slow.ttft_s == pytest.approx(2 * base.ttft_s) and slow.per_token_s == base.per_token_s


@pytest.mark.parametrize("draw", [0.0, 0.49])
def test_a_rate_is_a_share_of_the_draws(draw: float) -> None:
    reply = Reply("hello there", "stop", (ToolCall("c", "f", '{"q": "x"}'),))
    half = FaultSettings(refusal_rate=0.5)
    assert degrade(reply, half, [draw, 1, 1, 1, 1], None).finish_reason == "content_filter"
    assert degrade(reply, half, [0.5, 1, 1, 1, 1], None) == reply
