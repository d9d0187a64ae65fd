"""What the simulated model says to a conversation: text, JSON, or tool calls. Pure and deterministic.

Chat completions and the Responses API both turn their request into an :class:`Ask` (the
conversation in chat-message shape plus the generation options) and render the :class:`Reply`
in their own wire format. The order of decisions is the one real models follow: tool calls when
``tool_choice`` and the prompt ask for them; else the requested structured format (a JSON object,
or JSON generated from the schema); else an answer to the tool results the conversation ends
with; else the canned simulated text. Reasoning tokens are spent first and count against
``max_tokens``, as on OpenAI's reasoning models.
"""

from __future__ import annotations

import functools
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.simulator.answers import Answer, compose_answer, cut, quote, safe_text
from app.simulator.schema_values import value_for_schema
from app.simulator.tokens import token_spans, tokenize, truncate_to_tokens
from app.simulator.tools import FunctionTool, ToolMode, arguments_for, choose_tools, prompt_hint
from core.messages import content_text

__all__ = [
    "REASONING_TOKENS",
    "Ask",
    "Reply",
    "ToolCall",
    "pieces",
    "reply_to",
    "token_logprobs",
]

# Reasoning tokens a reasoning effort spends before the visible answer.
REASONING_TOKENS = {"none": 0, "minimal": 8, "low": 16, "medium": 64, "high": 256, "xhigh": 512, "max": 1024}

_ALTERNATIVES = (" the", " a", ",", ".", " and", " of", " to", " is", " in", " simulated", " it", " that")


@dataclass(frozen=True, slots=True)
class Ask:
    provider: str
    model: str
    messages: Sequence[Mapping[str, Any]]  # chat-message shape
    prompt: Sequence[str]  # pseudo-tokens of the conversation
    tools: Sequence[FunctionTool] = ()
    tool_mode: ToolMode = "auto"
    parallel_tool_calls: bool = True
    # None: text; {"type": "json_object"}; or {"type": "json_schema", "schema": {...}}
    text_format: Mapping[str, Any] | None = None
    max_tokens: int | None = None
    stop: Sequence[str] = ()
    seed: int | None = None
    reasoning_effort: str | None = None
    call_prefix: str = "call_"
    # Writes the canned text answer (``answers.compose_answer``); the provider hands it in.
    compose: Callable[..., Answer] = compose_answer


@dataclass(frozen=True, slots=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)  # no slots: the token counts are cached on the instance
class Reply:
    text: str | None  # None when the reply only calls tools
    finish_reason: str  # "stop", "length" or "tool_calls"
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_tokens: int = 0
    salt: str = field(default="", compare=False)

    @functools.cached_property
    def visible_tokens(self) -> int:
        calls = sum(len(tokenize(c.name)) + len(tokenize(c.arguments)) for c in self.tool_calls)
        return len(tokenize(self.text or "")) + calls

    @property
    def output_tokens(self) -> int:
        return self.visible_tokens + self.reasoning_tokens


def reply_to(ask: Ask, variant: int = 0) -> Reply:
    """The reply to ``ask``; ``variant`` (the choice index of ``n``) gives another text.

    Raises ``SchemaError`` when a function's parameters or the response format's schema cannot
    be served."""
    # The first choice without a seed keeps the plain answer; a seed or another choice re-draws it.
    salt = "" if variant == 0 and ask.seed is None else f"seed={ask.seed}\x00n={variant}"
    reasoning = REASONING_TOKENS.get(ask.reasoning_effort or "none", 0)
    budget = ask.max_tokens
    if budget is not None and reasoning >= budget:
        return Reply("", "length", reasoning_tokens=budget, salt=salt)
    visible_budget = None if budget is None else budget - reasoning

    ends_with_tool_results = bool(ask.messages) and ask.messages[-1].get("role") == "tool"
    last_user = None if ends_with_tool_results else _last_user_text(ask.messages)
    chosen = choose_tools(ask.tools, ask.tool_mode, parallel=ask.parallel_tool_calls, last_user_text=last_user)
    if chosen:
        prompt_text = last_user or _last_user_text(ask.messages) or ""
        calls = [
            ToolCall(f"{ask.call_prefix}{uuid.uuid4().hex[:24]}", tool.name, arguments_for(tool, prompt_text))
            for tool in chosen
        ]
        cut_calls = _within(calls, visible_budget)
        if not cut_calls:  # not even a function name fits
            return Reply("", "length", (), reasoning, salt)
        finish = "tool_calls" if cut_calls == calls else "length"
        return Reply(None, finish, tuple(cut_calls), reasoning, salt)

    answer = _text(ask, salt, visible_budget, ends_with_tool_results)
    return Reply(answer.text, answer.finish_reason, (), reasoning, salt)


def _within(calls: list[ToolCall], budget: int | None) -> list[ToolCall]:
    """The calls as far as ``budget`` tokens reach: the call it runs out in keeps its cut
    arguments (no longer valid JSON, as with a real model), later ones are never written."""
    if budget is None:
        return calls
    out: list[ToolCall] = []
    left = budget
    for call in calls:
        cost = len(tokenize(call.name)) + len(tokenize(call.arguments))
        if cost <= left:
            out.append(call)
            left -= cost
            continue
        room = left - len(tokenize(call.name))
        if room > 0:
            out.append(ToolCall(call.call_id, call.name, truncate_to_tokens(call.arguments, room)))
        break
    return out


def _text(ask: Ask, salt: str, budget: int | None, after_tools: bool) -> Answer:
    fmt = ask.text_format
    if fmt is not None and fmt.get("type") == "json_schema":
        value = value_for_schema(fmt.get("schema") or {}, hint=prompt_hint(_last_user_text(ask.messages) or ""))
        return cut(json.dumps(value, ensure_ascii=False, separators=(",", ":")), ask.stop, budget)
    if fmt is not None and fmt.get("type") == "json_object":
        said = quote(ask.messages)
        value = {
            "simulated": True,
            "provider": ask.provider,
            "model": ask.model,
            "answer": f"This is a simulated answer from a test upstream. You asked: {said}"
            if said
            else "This is a simulated answer from a test upstream.",
        }
        return cut(json.dumps(value, ensure_ascii=False), ask.stop, budget)
    if after_tools:
        return cut(_tool_results_text(ask), ask.stop, budget)
    return ask.compose(ask.provider, ask.model, ask.messages, ask.prompt, budget, salt=salt, stop=ask.stop)


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"), sep=" ")
    return None


def _tool_results_text(ask: Ask) -> str:
    """An answer that reports the tool results the conversation ends with."""
    names: dict[str, str] = {}
    for message in ask.messages:
        for call in message.get("tool_calls") or []:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                names[str(call.get("id"))] = str(call["function"].get("name", "the"))
    results: list[str] = []
    for message in reversed(ask.messages):
        if message.get("role") != "tool":
            break
        name = names.get(str(message.get("tool_call_id")), "the")
        results.append(f"The {name} tool returned: {_summary(message.get('content'))}.")
    results.reverse()
    head = f"[simulated {ask.provider}/{ask.model}] Based on the tool results:"
    return " ".join([head, *results, "This is a simulated answer from a test upstream, not a real model."])


def _summary(content: Any) -> str:
    text = content_text(content, sep=" ")
    try:
        value = json.loads(text)
    except ValueError:
        return safe_text(text) or "nothing"
    if isinstance(value, Mapping):
        flat = ", ".join(f"{key} {_scalar(item)}" for key, item in value.items())
        return safe_text(flat) or "nothing"
    return safe_text(_scalar(value)) or "nothing"


def _scalar(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# ---- tokens as streamed, and their log probabilities -------------------------------------------


def pieces(text: str) -> list[str]:
    """``text`` as the stream sends it: one piece per token, each with the spaces before it."""
    if not text:
        return []
    ends = [end for _, end in token_spans(text)] or [len(text)]
    ends[-1] = len(text)
    return [text[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def token_logprobs(tokens: Sequence[str], top: int, salt: str) -> list[dict[str, Any]]:
    """OpenAI ``ChatCompletionTokenLogprob`` entries for ``tokens``: deterministic log
    probabilities, each token the most likely at its position, ``top`` alternatives listed."""
    out: list[dict[str, Any]] = []
    for index, token in enumerate(tokens):
        logprob = -round(_unit(salt, str(index), token) ** 2 * 2.0, 6)
        alternatives: list[dict[str, Any]] = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
        next_logprob = logprob
        for alt_index, alt in enumerate(a for a in _ALTERNATIVES if a != token):
            if len(alternatives) >= top:
                break
            next_logprob = round(next_logprob - 0.25 - _unit(salt, str(index), str(alt_index)) * 2.0, 6)
            alternatives.append({"token": alt, "logprob": next_logprob, "bytes": list(alt.encode())})
        out.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alternatives[:top]}
        )
    return out
