"""``/v1/responses`` of the simulator (the Responses API): create (streamed or not), retrieve,
delete, and conversation state through ``previous_response_id``.

The input (a string, or message / ``function_call`` / ``function_call_output`` items) and the
``instructions`` become a chat-shaped conversation answered by the same generator as chat
completions, so tools, structured output (``text.format``), ``max_output_tokens`` and
``reasoning.effort`` behave alike on both APIs. The answer is a ``response`` object, or the
semantic stream events (``response.created`` ... ``response.completed``) with increasing
``sequence_number``, each sent as ``event: TYPE`` + ``data: JSON`` like OpenAI's.

Stored responses (``store`` defaults to true) are kept in a bounded :class:`ResponseStore`; a
``previous_response_id`` continues the stored conversation (its input and output, without its
instructions), an unknown one is OpenAI's ``previous_response_not_found``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.simulator.answers import Answer, compose_answer
from app.simulator.chat import SERVICE_TIERS, parse_schema_format, parse_tool_choice, parse_tools
from app.simulator.errors import BadRequest, invalid
from app.simulator.generation import REASONING_TOKENS, Ask, Reply, pieces, reply_to, token_logprobs
from app.simulator.prefix_cache import PrefixCache
from app.simulator.schema_values import SchemaError
from app.simulator.tokens import prompt_tokens
from app.simulator.wire import (
    Frame,
    Pace,
    Planned,
    check_bool,
    check_int,
    check_metadata,
    check_model,
    check_number,
    check_object,
    check_string,
    sse_event,
)

__all__ = ["MIN_OUTPUT_TOKENS", "ResponseStore", "plan_response"]

MIN_OUTPUT_TOKENS = 16  # OpenAI refuses a smaller max_output_tokens
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_INPUT_ROLES = ("user", "assistant", "system", "developer")
_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(frozen=True, slots=True)
class _Stored:
    response: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]  # chat-shaped, input and output, without instructions


class ResponseStore:
    """The responses a simulator created with ``store``, the newest ``max_entries`` of them."""

    def __init__(self, max_entries: int = 10_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Stored] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def put(self, response: dict[str, Any], conversation: Sequence[dict[str, Any]]) -> None:
        with self._lock:
            self._entries[response["id"]] = _Stored(response, tuple(conversation))
            self._entries.move_to_end(response["id"])
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> _Stored | None:
        with self._lock:
            return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None


# ---- request ------------------------------------------------------------------------------------


def _parts_text(content: Any, where: str) -> Any:
    """A message item's content as chat content (text parts kept, others reduced to their type)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content", "expected a string or an array of content parts.", "invalid_type")
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise invalid(f"{where}.content[{index}]", "expected an object with a 'type'.", "invalid_type")
        if part["type"] in _TEXT_PARTS:
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{index}].text", "expected a string.", "invalid_type")
            parts.append({"type": "text", "text": part["text"]})
        elif part["type"] == "refusal":
            parts.append({"type": "text", "text": str(part.get("refusal", ""))})
        else:
            parts.append({"type": part["type"]})
    return parts


def _conversation(value: Any) -> list[dict[str, Any]]:
    """The ``input`` as chat-shaped messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid("input", "expected a string or an array of input items.", "invalid_type")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, Mapping):
            raise invalid(where, "expected an object.", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _INPUT_ROLES:
                raise invalid(f"{where}.role", "value must be one of 'user', 'assistant', 'system', 'developer'.")
            messages.append({"role": role, "content": _parts_text(item.get("content"), where)})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
                raise invalid(where, "a function_call item needs string 'call_id', 'name' and 'arguments'.")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if messages and messages[-1].get("role") == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise BadRequest(
                    400,
                    f"Missing required parameter: '{where}.call_id'.",
                    "missing_required_parameter",
                    f"{where}.call_id",
                )
            content = output if isinstance(output, str) else _parts_text(output, where)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        # Reasoning items, item references and hosted tools' items carry nothing to answer.
    return messages


def _check_call_outputs(conversation: Sequence[Mapping[str, Any]]) -> None:
    """Every ``function_call_output`` answers an earlier ``function_call``, and every call has its
    output, as OpenAI requires."""
    calls: set[str] = set()
    answered: set[str] = set()
    for message in conversation:
        calls.update(str(c.get("id")) for c in message.get("tool_calls") or ())
        call_id = message.get("tool_call_id")
        if message.get("role") == "tool":
            if call_id not in calls:
                raise BadRequest(
                    400, f"No tool call found for function call output with call_id {call_id}.", None, "input"
                )
            answered.add(str(call_id))
    missing = sorted(calls - answered)
    if missing:
        raise BadRequest(400, f"No tool output found for function call {missing[0]}.", None, "input")


@dataclass(frozen=True, slots=True)
class _ResponsesRequest:
    ask: Ask
    stream: bool
    store: bool
    conversation: list[dict[str, Any]]  # without instructions
    echo: dict[str, Any]  # request fields the response object repeats
    logprobs: bool
    top_logprobs: int


def _echo_tools(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return []
    out = []
    for tool in value:
        if isinstance(tool, Mapping) and tool.get("type") == "function":
            out.append({"description": None, "strict": True, **tool, "parameters": tool.get("parameters") or {}})
        else:
            out.append(tool)
    return out


def _parse(
    body: Mapping[str, Any],
    provider: str,
    models: Sequence[str],
    store: ResponseStore,
    compose: Callable[..., Answer],
) -> _ResponsesRequest:
    model = check_model(body, models)
    previous_id = check_string(body, "previous_response_id")
    if "input" not in body and previous_id is None:
        raise BadRequest(400, "Missing required parameter: 'input'.", "missing_required_parameter", "input")
    new_messages = _conversation(body["input"]) if body.get("input") is not None else []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid("instructions", "expected a string.", "invalid_type")
    history: list[dict[str, Any]] = []
    if previous_id is not None:
        stored = store.get(previous_id)
        if stored is None:
            raise BadRequest(
                400,
                f"Previous response with id '{previous_id}' not found.",
                "previous_response_not_found",
                "previous_response_id",
            )
        history = [dict(m) for m in stored.conversation]
    conversation = history + new_messages
    if not conversation:
        raise invalid("input", "the conversation has no input.", "empty_array")
    _check_call_outputs(conversation)
    messages = ([{"role": "developer", "content": instructions}] if instructions else []) + conversation

    max_output = check_int(body, "max_output_tokens", MIN_OUTPUT_TOKENS)
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    top = check_int(body, "top_logprobs", 0, 20)
    parallel = check_bool(body, "parallel_tool_calls")
    stream = bool(check_bool(body, "stream"))
    keep = check_bool(body, "store")
    metadata = check_metadata(body)
    tier = check_string(body, "service_tier", SERVICE_TIERS) or "auto"
    truncation = check_string(body, "truncation", ("auto", "disabled")) or "disabled"
    reasoning = check_object(body, "reasoning") or {}
    effort = check_string(reasoning, "effort", tuple(REASONING_TOKENS))
    text = check_object(body, "text") or {}
    text_format = parse_schema_format(text.get("format"), "text.format", flat=True)
    tools = parse_tools(body.get("tools"), flat=True)
    mode, callable_tools = parse_tool_choice(
        body.get("tool_choice"), tools, declared=body.get("tools") is not None, flat=True
    )
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(i, str) for i in include)):
        raise invalid("include", "expected an array of strings.", "invalid_type")

    ask = Ask(
        provider=provider,
        model=model,
        messages=messages,
        prompt=prompt_tokens(messages),
        tools=callable_tools,
        tool_mode=mode,
        parallel_tool_calls=True if parallel is None else parallel,
        text_format=text_format,
        max_tokens=max_output,
        seed=None,
        reasoning_effort=effort,
        compose=compose,
    )
    echo = {
        "instructions": instructions,
        "max_output_tokens": max_output,
        "metadata": metadata or {},
        "parallel_tool_calls": True if parallel is None else parallel,
        "previous_response_id": previous_id,
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "service_tier": "default" if tier == "auto" else tier,
        "store": True if keep is None else keep,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": _echo_tools(body.get("tools")),
        "top_logprobs": top or 0,
        "top_p": body.get("top_p", 1.0),
        "truncation": truncation,
    }
    if isinstance(body.get("user"), str):  # the spec's ``user`` is a string, never null
        echo["user"] = body["user"]
    logprobs = include is not None and _LOGPROBS_INCLUDE in include
    return _ResponsesRequest(ask, stream, echo["store"], conversation, echo, logprobs, top or 0)


# ---- answer -------------------------------------------------------------------------------------


def _items(reply: Reply, request: _ResponsesRequest, status: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning_tokens:
        items.append({"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "summary": []})
    for call in reply.tool_calls:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "completed",
                "arguments": call.arguments,
                "call_id": call.call_id,
                "name": call.name,
            }
        )
    if reply.text or (reply.text is not None and status == "completed"):
        logprobs = (
            token_logprobs(pieces(reply.text), request.top_logprobs, reply.salt + request.ask.model)
            if request.logprobs
            else []
        )
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": logprobs}],
            }
        )
    return items


def _as_messages(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Output items as the chat-shaped turns a continuation reads."""
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items
        if i["type"] == "function_call"
    ]
    texts = [p["text"] for i in items if i["type"] == "message" for p in i["content"]]
    if calls:
        return [{"role": "assistant", "content": None, "tool_calls": calls}]
    return [{"role": "assistant", "content": " ".join(texts)}] if texts else []


def plan_response(
    body: Mapping[str, Any],
    *,
    provider: str,
    models: Sequence[str],
    prefix_cache: PrefixCache,
    store: ResponseStore,
    pace: Pace,
    compose: Callable[..., Answer] = compose_answer,
) -> Planned:
    """The answer to a create-response request ``body``; raises ``BadRequest``."""
    request = _parse(body, provider, models, store, compose)
    try:
        reply = reply_to(request.ask)
    except SchemaError as exc:
        raise BadRequest(400, f"Invalid schema: {exc}", "invalid_json_schema", "text.format") from None
    prompt = request.ask.prompt
    cached = prefix_cache.lookup_and_insert(prompt)
    written = len(prompt) // prefix_cache.block_tokens * prefix_cache.block_tokens - cached
    incomplete = reply.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    items = _items(reply, request, status)
    created = int(time.time())
    usage = {
        "input_tokens": len(prompt),
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": max(written, 0)},
        "output_tokens": reply.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
        "total_tokens": len(prompt) + reply.output_tokens,
    }
    response = {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "completed_at": None if incomplete else created,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "max_tool_calls": None,
        "model": request.ask.model,
        "output": items,
        "prompt_cache_key": None,
        "safety_identifier": None,
        **request.echo,
        "usage": usage,
    }
    if request.store:
        store.put(response, [*request.conversation, *_as_messages(items)])
    tokens = len(prompt) + reply.output_tokens
    first_s = pace.ttft_s + reply.reasoning_tokens * pace.per_token_s
    if not request.stream:
        delay = pace.ttft_s + reply.output_tokens * pace.per_token_s
        return Planned(body=response, delay_s=delay, tokens=tokens, processing_ms=round(delay * 1000))
    return Planned(
        frames=_frames(response, request, first_s, pace.per_token_s), tokens=tokens, processing_ms=round(first_s * 1000)
    )


def _frames(response: Mapping[str, Any], request: _ResponsesRequest, first_s: float, per_token_s: float) -> list[Frame]:
    """The semantic events; everything up to the first delta goes out at the first token, each
    further delta one token later."""
    events: list[tuple[bool, dict[str, Any]]] = []  # (is a delta, event without sequence_number)

    def add(payload: dict[str, Any], delta: bool = False) -> None:
        events.append((delta, payload))

    # The in-progress response has no output and no usage yet (the spec's usage is never null).
    snapshot = {key: value for key, value in response.items() if key != "usage"}
    snapshot.update(status="in_progress", output=[], completed_at=None, incomplete_details=None)
    add({"type": "response.created", "response": snapshot})
    add({"type": "response.in_progress", "response": snapshot})
    for output_index, item in enumerate(response["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            add(
                {
                    "type": "response.output_item.added",
                    "output_index": output_index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            base = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
            add(
                {
                    "type": "response.content_part.added",
                    **base,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                }
            )
            logprobs = part.get("logprobs") or []
            for index, token in enumerate(pieces(part["text"])):
                entry = [logprobs[index]] if index < len(logprobs) else []
                add({"type": "response.output_text.delta", **base, "delta": token, "logprobs": entry}, delta=True)
            add({"type": "response.output_text.done", **base, "text": part["text"], "logprobs": logprobs})
            add({"type": "response.content_part.done", **base, "part": part})
        elif item["type"] == "function_call":
            add(
                {
                    "type": "response.output_item.added",
                    "output_index": output_index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            base = {"item_id": item["id"], "output_index": output_index}
            for fragment in pieces(item["arguments"]):
                add({"type": "response.function_call_arguments.delta", **base, "delta": fragment}, delta=True)
            add(
                {
                    "type": "response.function_call_arguments.done",
                    **base,
                    "arguments": item["arguments"],
                    "name": item["name"],
                }
            )
        else:
            add({"type": "response.output_item.added", "output_index": output_index, "item": item})
        add({"type": "response.output_item.done", "output_index": output_index, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    add({"type": final, "response": response})

    frames: list[Frame] = []
    pending: list[bytes] = []
    for sequence_number, (delta, payload) in enumerate(events):
        pending.append(sse_event({"type": payload["type"], "sequence_number": sequence_number, **payload}))
        if delta:
            frames.append(Frame(per_token_s if frames else first_s, b"".join(pending)))
            pending = []
    if pending:
        frames.append(Frame(0.0 if frames else first_s, b"".join(pending)))
    return frames
