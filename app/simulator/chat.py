"""``POST /v1/chat/completions`` of the simulator: the request checked as OpenAI checks it, the
answer built as a ``chat.completion`` body or a stream of ``chat.completion.chunk`` events.

Everything the request asks for is honoured: ``tools``/``tool_choice``/``parallel_tool_calls``,
``response_format`` (JSON object or schema), ``n`` choices, ``logprobs``/``top_logprobs``,
``stop``, ``max_tokens``/``max_completion_tokens``, ``seed``, ``reasoning_effort``,
``service_tier`` and ``stream_options.include_usage``. Unknown parameters are ignored, as real
upstreams do; known ones with invalid values get OpenAI's 400.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.simulator.answers import Answer, compose_answer
from app.simulator.errors import BadRequest, invalid
from app.simulator.generation import REASONING_TOKENS, Ask, Reply, pieces, reply_to, token_logprobs
from app.simulator.prefix_cache import PrefixCache
from app.simulator.schema_values import SchemaError
from app.simulator.tokens import prompt_tokens, tokenize
from app.simulator.tools import FunctionTool, ToolMode
from app.simulator.wire import (
    INT64_MAX,
    INT64_MIN,
    Frame,
    Pace,
    Planned,
    check_bool,
    check_int,
    check_metadata,
    check_model,
    check_number,
    check_object,
    check_stop,
    check_string,
    dumps,
    sse_data,
    usage_counts,
)

__all__ = ["SERVICE_TIERS", "parse_tool_choice", "parse_tools", "plan_chat"]

SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
MAX_CHOICES = 128
MAX_TOOLS = 128
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_PART_TYPES = ("text", "image_url", "input_audio", "file", "refusal")


@dataclass(frozen=True, slots=True)
class _ChatRequest:
    ask: Ask
    n: int
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    service_tier: str


# ---- request ------------------------------------------------------------------------------------


def _check_messages(value: Any) -> list[dict[str, Any]]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    ):
        raise BadRequest(
            400, "'messages' must be a non-empty array of objects with a 'role'.", "invalid_value", "messages"
        )
    call_ids: set[str] = set()
    unanswered: list[str] = []  # tool calls of the last assistant turn still without a result
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        role = message["role"]
        if unanswered and role != "tool":
            raise _unanswered(unanswered, f"messages[{index}]")
        if role not in _ROLES:
            listed = ", ".join(f"'{r}'" for r in _ROLES)
            raise invalid(f"{where}.role", f"value must be one of {listed}, got '{role}'.")
        content = message.get("content")
        if isinstance(content, list):
            for part_index, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") not in _PART_TYPES:
                    raise invalid(
                        f"{where}.content[{part_index}].type",
                        "expected one of 'text', 'image_url', 'input_audio', 'file' or 'refusal'.",
                    )
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise invalid(f"{where}.content[{part_index}].text", "expected a string.", "invalid_type")
        elif content is not None and not isinstance(content, str):
            raise invalid(f"{where}.content", "expected a string or an array of content parts.", "invalid_type")
        tool_calls = message.get("tool_calls")
        if role == "assistant":
            if tool_calls is not None:
                if not isinstance(tool_calls, list) or not all(
                    isinstance(c, Mapping) and isinstance(c.get("id"), str) and isinstance(c.get("function"), Mapping)
                    for c in tool_calls
                ):
                    raise invalid(f"{where}.tool_calls", "expected an array of tool calls with 'id' and 'function'.")
                call_ids.update(c["id"] for c in tool_calls)
                unanswered = [c["id"] for c in tool_calls]
            if content is None and not tool_calls and message.get("function_call") is None:
                raise BadRequest(
                    400,
                    f"Invalid value for '{where}.content': expected a string, got null.",
                    "invalid_value",
                    f"{where}.content",
                )
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise BadRequest(
                    400,
                    f"Missing required parameter: '{where}.tool_call_id'.",
                    "missing_required_parameter",
                    f"{where}.tool_call_id",
                )
            if call_id in unanswered:
                unanswered.remove(call_id)
            if call_id not in call_ids:
                raise BadRequest(
                    400,
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                    "'tool_calls'.",
                    None,
                    f"{where}.role",
                )
        elif content is None and role != "function":
            raise BadRequest(
                400,
                f"Invalid value for '{where}.content': expected a string, got null.",
                "invalid_value",
                f"{where}.content",
            )
    if unanswered:
        raise _unanswered(unanswered, "messages")
    return value


def _unanswered(call_ids: Sequence[str], param: str) -> BadRequest:
    return BadRequest(
        400,
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(call_ids)}",
        None,
        param,
    )


def parse_tools(value: Any, *, flat: bool) -> list[FunctionTool]:
    """Function tools of a request: chat's ``{"type": "function", "function": {...}}`` or, with
    ``flat``, the Responses API's ``{"type": "function", "name": ...}``. Other tool types are
    accepted and never called."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "expected an array of tools.", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise invalid(
            "tools", f"array too long. Expected an array with maximum length {MAX_TOOLS}.", "array_above_max_length"
        )
    tools: list[FunctionTool] = []
    for index, tool in enumerate(value):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("type"), str):
            raise invalid(f"tools[{index}]", "expected an object with a 'type'.", "invalid_type")
        if tool["type"] != "function":
            continue
        spec = tool if flat else tool.get("function")
        where = f"tools[{index}]" if flat else f"tools[{index}].function"
        if not isinstance(spec, Mapping):
            raise BadRequest(400, f"Missing required parameter: '{where}'.", "missing_required_parameter", where)
        name = spec.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
            raise invalid(
                f"{where}.name",
                "string does not match pattern. Expected a string that matches the "
                "pattern '^[a-zA-Z0-9_-]+$' (at most 64 characters).",
                "invalid_value",
            )
        parameters = spec.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise invalid(f"{where}.parameters", "expected an object (a JSON schema).", "invalid_type")
        description = spec.get("description")
        tools.append(FunctionTool(name, description if isinstance(description, str) else "", parameters or {}))
    return tools


def parse_tool_choice(
    value: Any, tools: Sequence[FunctionTool], *, declared: bool, flat: bool
) -> tuple[ToolMode, list[FunctionTool]]:
    """The tool mode and the tools it may call. ``declared``: the request had a ``tools`` array."""
    if value is None:
        return ("auto" if tools else "none"), list(tools)
    if not declared:
        raise BadRequest(
            400,
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            "invalid_value",
            "tool_choice",
        )
    if value in ("none", "auto", "required"):
        return value, list(tools)
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == "function":
            spec = value if flat else value.get("function")
            name = spec.get("name") if isinstance(spec, Mapping) else None
            if not isinstance(name, str):
                raise BadRequest(
                    400,
                    "Missing required parameter: 'tool_choice.function.name'.",
                    "missing_required_parameter",
                    "tool_choice",
                )
            if name not in {t.name for t in tools}:
                raise BadRequest(
                    400,
                    f"Invalid value for 'tool_choice': no function named '{name}' was specified "
                    "in the 'tools' parameter.",
                    "invalid_value",
                    "tool_choice",
                )
            return name, list(tools)
        if kind == "allowed_tools":
            spec = value if flat else value.get("allowed_tools")
            spec = spec if isinstance(spec, Mapping) else {}
            mode = spec.get("mode", "auto")
            listed = spec.get("tools")
            allowed: list[Any] = listed if isinstance(listed, list) else []
            names = {
                (t.get("name") if flat or "function" not in t else (t.get("function") or {}).get("name"))
                for t in allowed
                if isinstance(t, Mapping)
            }
            if mode not in ("auto", "required"):
                raise invalid("tool_choice.mode", "value must be one of 'auto', 'required'.")
            return mode, [t for t in tools if t.name in names]
        if isinstance(kind, str):
            return "auto", list(tools)  # a hosted tool: the simulator has none, so it answers
    raise invalid("tool_choice", "expected 'none', 'auto', 'required' or a named tool.")


def parse_schema_format(value: Any, param: str, *, flat: bool) -> Mapping[str, Any] | None:
    """``response_format`` (chat) or ``text.format`` (Responses, ``flat``) as the generator's
    ``text_format``."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid(f"{param}.type", "value must be one of 'text', 'json_object', 'json_schema'.")
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return {"type": "json_object"}
    spec = value if flat else value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise BadRequest(
            400,
            f"Missing required parameter: '{param}.json_schema'.",
            "missing_required_parameter",
            f"{param}.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise invalid(
            f"{param}.{'' if flat else 'json_schema.'}name",
            "string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
        )
    schema = spec.get("schema", {})
    if not isinstance(schema, Mapping):
        raise invalid(f"{param}.{'' if flat else 'json_schema.'}schema", "expected an object.", "invalid_type")
    return {"type": "json_schema", "name": name, "schema": schema}


def _parse(
    body: Mapping[str, Any], provider: str, models: Sequence[str], compose: Callable[..., Answer]
) -> _ChatRequest:
    model = check_model(body, models)
    messages = _check_messages(body.get("messages"))
    max_tokens = check_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = check_int(body, "max_tokens", 1)
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    check_number(body, "presence_penalty", -2, 2)
    check_number(body, "frequency_penalty", -2, 2)
    n = check_int(body, "n", 1, MAX_CHOICES) or 1
    seed = check_int(body, "seed", INT64_MIN, INT64_MAX)
    stream = bool(check_bool(body, "stream"))
    options = check_object(body, "stream_options")
    if options is not None and not stream:
        raise BadRequest(
            400,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "invalid_value",
            "stream_options",
        )
    logprobs = bool(check_bool(body, "logprobs"))
    top = check_int(body, "top_logprobs", 0, 20)
    if top is not None and not logprobs:
        raise BadRequest(
            400,
            "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.",
            "invalid_value",
            "top_logprobs",
        )
    effort = check_string(body, "reasoning_effort", tuple(REASONING_TOKENS))
    tier = check_string(body, "service_tier", SERVICE_TIERS) or "auto"
    parallel = check_bool(body, "parallel_tool_calls")
    check_metadata(body)
    check_object(body, "logit_bias")
    tools = parse_tools(body.get("tools"), flat=False)
    mode, callable_tools = parse_tool_choice(
        body.get("tool_choice"), tools, declared=body.get("tools") is not None, flat=False
    )
    text_format = parse_schema_format(body.get("response_format"), "response_format", flat=False)

    prompt = prompt_tokens(messages)
    if body.get("tools"):
        # The tool definitions are part of what the model reads, before the conversation.
        prompt = tokenize(json.dumps(body["tools"], ensure_ascii=False)) + prompt
    ask = Ask(
        provider=provider,
        model=model,
        messages=messages,
        prompt=prompt,
        tools=callable_tools,
        tool_mode=mode,
        parallel_tool_calls=True if parallel is None else parallel,
        text_format=text_format,
        max_tokens=max_tokens,
        stop=check_stop(body),
        seed=seed,
        reasoning_effort=effort,
        compose=compose,
    )
    include_usage = bool(options and options.get("include_usage") is True)
    return _ChatRequest(ask, n, stream, include_usage, logprobs, top or 0, "default" if tier == "auto" else tier)


# ---- answer -------------------------------------------------------------------------------------


def plan_chat(
    body: Mapping[str, Any],
    *,
    provider: str,
    models: Sequence[str],
    prefix_cache: PrefixCache,
    pace: Pace,
    compose: Callable[..., Answer] = compose_answer,
    degrade: Callable[[Reply, Mapping[str, Any] | None], Reply] | None = None,
) -> Planned:
    """The answer to a chat completion request ``body``; raises ``BadRequest``. ``degrade``: the
    answer-quality faults, applied to each reply (:mod:`app.simulator.degrade`)."""
    request = _parse(body, provider, models, compose)
    try:
        replies = [reply_to(request.ask, variant) for variant in range(request.n)]
        if degrade is not None:
            replies = [degrade(r, request.ask.text_format) for r in replies]
    except SchemaError as exc:
        raise BadRequest(400, f"Invalid schema: {exc}", "invalid_json_schema", "response_format") from None
    prompt = request.ask.prompt
    cached = prefix_cache.lookup_and_insert(prompt)
    completion = sum(r.output_tokens for r in replies)
    reasoning = sum(r.reasoning_tokens for r in replies)
    usage = usage_counts(len(prompt), cached, completion, reasoning)
    head = {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "created": int(time.time()),
        "model": request.ask.model,
        "service_tier": request.service_tier,
        "system_fingerprint": f"fp_sim_{provider}",
    }
    longest = max(r.output_tokens for r in replies)
    first_s = pace.ttft_s + max(r.reasoning_tokens for r in replies) * pace.per_token_s
    if not request.stream:
        choices = [_choice(index, reply, request) for index, reply in enumerate(replies)]
        delay = pace.ttft_s + longest * pace.per_token_s
        body_out = {**head, "object": "chat.completion", "choices": choices, "usage": usage}
        return Planned(body=body_out, delay_s=delay, tokens=len(prompt) + completion, processing_ms=round(delay * 1000))
    frames = _frames(head, replies, request, usage, first_s, pace.per_token_s)
    return Planned(frames=frames, tokens=len(prompt) + completion, processing_ms=round(first_s * 1000))


def _logprobs(reply: Reply, request: _ChatRequest, tokens: Sequence[str]) -> dict[str, Any] | None:
    if not request.logprobs:
        return None
    if reply.text is None:
        return {"content": None, "refusal": None}
    entries = token_logprobs(tokens, request.top_logprobs, reply.salt + request.ask.model)
    return {"content": entries, "refusal": None}


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in reply.tool_calls
    ]


def _choice(index: int, reply: Reply, request: _ChatRequest) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None, "annotations": []}
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply)
    return {
        "index": index,
        "message": message,
        "logprobs": _logprobs(reply, request, pieces(reply.text or "")) if request.logprobs else None,
        "finish_reason": reply.finish_reason,
    }


def _frames(
    head: Mapping[str, Any],
    replies: Sequence[Reply],
    request: _ChatRequest,
    usage: Mapping[str, Any],
    first_s: float,
    per_token_s: float,
) -> list[Frame]:
    """The stream: choices interleaved token by token; the role event and each choice's first
    token go out together, so the first byte is the first token."""
    # Every chunk shares its envelope; only the choice is encoded per chunk.
    envelope = dumps({**head, "object": "chat.completion.chunk", "choices": []})
    prefix = ("data: " + envelope[: envelope.rindex("[]")] + "[").encode()
    suffix = ("]" + (',"usage":null' if request.include_usage else "") + "}\n\n").encode()

    def chunk(index: int, delta: Mapping[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return prefix + dumps(choice).encode() + suffix

    steps: list[list[bytes]] = []
    for index, reply in enumerate(replies):
        for step, event in enumerate(_choice_events(index, reply, request, chunk)):
            while len(steps) <= step:
                steps.append([])
            steps[step].append(event)
    frames = [Frame(first_s if step == 0 else per_token_s, b"".join(events)) for step, events in enumerate(steps)]
    tail = [chunk(index, {}, reply.finish_reason) for index, reply in enumerate(replies)]
    if request.include_usage:
        tail.append(sse_data({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}))
    tail.append(sse_data("[DONE]"))
    frames.append(Frame(0.0, b"".join(tail)))
    return frames


def _choice_events(index: int, reply: Reply, request: _ChatRequest, chunk: Any) -> list[bytes]:
    """One choice's events, one per step: the first carries the role."""
    if reply.tool_calls:
        events: list[bytes] = []
        for call_index, call in enumerate(reply.tool_calls):
            start = {
                "index": call_index,
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            delta: dict[str, Any] = {"tool_calls": [start]}
            if call_index == 0:
                delta = {"role": "assistant", "content": None, "refusal": None, **delta}
            events.append(chunk(index, delta, logprobs=_logprobs(reply, request, [])))
            for fragment in pieces(call.arguments):
                events.append(
                    chunk(index, {"tool_calls": [{"index": call_index, "function": {"arguments": fragment}}]})
                )
        return events
    tokens = pieces(reply.text or "")
    entries = _logprobs(reply, request, tokens)
    role = chunk(index, {"role": "assistant", "content": "", "refusal": None}, logprobs=None)
    if not tokens:
        return [role]

    def token_logprobs_at(i: int) -> Any:
        return None if entries is None else {"content": [entries["content"][i]], "refusal": None}

    events = [role + chunk(index, {"content": tokens[0]}, logprobs=token_logprobs_at(0))]
    events += [chunk(index, {"content": token}, logprobs=token_logprobs_at(i)) for i, token in enumerate(tokens) if i]
    return events
