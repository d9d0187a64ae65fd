"""The Responses API on a provider that serves only chat completions, translated both ways, sans
I/O (LiteLLM's proxy has such a bridge): a ``POST /v1/responses`` body becomes a chat completions
body (:func:`chat_request`), the chat answer becomes a ``response`` object (:func:`response_body`),
and a chat stream becomes the Responses API's semantic events (:class:`EventBridge`). So the
Vercel AI SDK's default model, the OpenAI Agents SDK and pydantic-ai's Responses model work through
the gateway on any provider.

Every field of the request is accounted for: carried to its chat completions counterpart, answered
by the gateway itself (``model``, ``stream``), or refused by name before any call (a 400 whose
``param`` is the field) when chat completions cannot express it: a ``previous_response_id`` or
``conversation`` (chat is stateless; the gateway keeps no conversations), built-in tools (web
search, file search, computer use, MCP), ``background``, ``store: true`` (a bridged response is
stored nowhere), ``truncation: "auto"``, a reasoning summary, and any field this module does not
know. Nothing is dropped without a word. What comes back is carried whole too: text with its
logprobs and annotations, tool calls, and a refusal as a refusal content part (plain and streamed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.routing.errors import BadResponse
from core.errors import InvalidRequest

#: Responses fields with the same name and meaning in chat completions.
SAME = (
    "temperature",
    "top_p",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
)
#: Responses fields the gateway answers for itself, or that this module translates.
OWNED = frozenset(
    {
        "model",
        "stream",
        "stream_options",  # include_obfuscation: the bridge's events carry no obfuscation padding
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "reasoning",
        "text",
        "include",
        "top_logprobs",
        "store",
        "background",
        "truncation",
        "previous_response_id",
    }
)
#: ``include`` values the bridged answer satisfies. Logprobs are asked of the chat upstream; the
#: others concern items a bridged answer never holds (reasoning items, built-in tool calls, which
#: are refused), so they ask for nothing that could be missing.
LOGPROBS = "message.output_text.logprobs"
VACUOUS_INCLUDES = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
    }
)
_NATIVE = "needs a provider that serves the Responses API"


class NotBridgeable(InvalidRequest):
    """A Responses API request that chat completions cannot express; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _part(part: object) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise InvalidRequest("each content part must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        url = part.get("image_url") or part.get("file_id")
        return {"type": "image_url", "image_url": {"url": url, "detail": part.get("detail", "auto")}}
    if kind == "input_file":
        return {"type": "file", "file": {k: part[k] for k in ("file_id", "file_data", "filename") if k in part}}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    raise NotBridgeable(f"input: the content part type {kind!r} {_NATIVE}", "input")


def _tool_output(output: object) -> object:
    """A ``function_call_output``'s output as a chat tool message's content (text only)."""
    if not isinstance(output, list):
        return output
    parts = [_part(p) for p in output]
    if any(p["type"] != "text" for p in parts):
        raise NotBridgeable(
            f"input: a function_call_output with images or files {_NATIVE} (chat tool results are text)", "input"
        )
    return parts


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        out.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise InvalidRequest("input must be text or a list of input items")
    for item in items:
        if not isinstance(item, Mapping):
            raise InvalidRequest("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = [_part(p) for p in content]
                if item.get("role") == "assistant":  # chat assistant turns take text only
                    content = "".join(p.get("text", "") for p in content)
            out.append({"role": item.get("role", "user"), "content": content})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = out[-1] if out else None
            if last is not None and last.get("role") == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _tool_output(item.get("output"))}
            )
        elif kind == "reasoning":
            continue  # a chat upstream has no use for another model's reasoning summary
        else:
            raise NotBridgeable(f"input: the item type {kind!r} {_NATIVE}", "input")
    return out


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list")
    out = []
    for t in tools:
        if not isinstance(t, Mapping) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, Mapping) else type(t).__name__
            raise NotBridgeable(
                f"tools: the tool type {kind!r} {_NATIVE} (chat completions call functions only)", "tools"
            )
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: object, has_tools: bool) -> object:
    """The chat ``tool_choice`` for a Responses one; None when there is nothing to choose from."""
    if isinstance(choice, str):
        return choice if has_tools or choice == "required" else None  # auto/none without tools say nothing
    if not isinstance(choice, Mapping):
        raise InvalidRequest("tool_choice must be a string or an object")
    kind = choice.get("type")
    if kind == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if kind == "allowed_tools":
        tools = choice.get("tools")
        if not isinstance(tools, list) or not all(
            isinstance(t, Mapping) and t.get("type") == "function" for t in tools
        ):
            raise NotBridgeable(f"tool_choice allowed_tools with tools other than functions {_NATIVE}", "tool_choice")
        allowed = [{"type": "function", "function": {"name": t.get("name")}} for t in tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": allowed}}
    raise NotBridgeable(f"tool_choice of type {kind!r} {_NATIVE}", "tool_choice")


def _logprobs(body: Mapping[str, Any]) -> dict[str, Any]:
    """``include`` and ``top_logprobs`` as chat's ``logprobs`` / ``top_logprobs``."""
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list):
        raise InvalidRequest("include must be a list")
    for value in include:
        if value != LOGPROBS and value not in VACUOUS_INCLUDES:
            raise NotBridgeable(f"include {value!r} {_NATIVE}", "include")
    top = body.get("top_logprobs")
    if LOGPROBS not in include and top is None:
        return {}
    # top_logprobs alone asks for the alternatives, which chat completions give only with logprobs.
    return {"logprobs": True, **({"top_logprobs": top} if top is not None else {})}


def _refuse_what_chat_cannot_say(body: Mapping[str, Any]) -> None:
    for name in ("previous_response_id", "conversation"):
        if body.get(name):
            raise NotBridgeable(
                f"{name} {_NATIVE} (chat completions keep no conversation); send the whole conversation "
                "in input instead",
                name,
            )
    if body.get("background"):
        raise NotBridgeable(
            f"background {_NATIVE} (a chat completion is answered while the caller waits)", "background"
        )
    if body.get("store") is True:
        raise NotBridgeable(
            f"store: true {_NATIVE} (the gateway stores no bridged response); send store: false", "store"
        )
    if body.get("truncation") not in (None, "disabled"):
        raise NotBridgeable(f"truncation {body['truncation']!r} {_NATIVE}; send truncation: 'disabled'", "truncation")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        for name in ("summary", "generate_summary"):
            if reasoning.get(name) is not None:
                raise NotBridgeable(f"reasoning.{name} {_NATIVE} (chat completions return no reasoning summary)",
                                    f"reasoning.{name}")  # fmt: skip
    for name, value in body.items():
        if name not in OWNED and name not in SAME and value is not None:
            raise NotBridgeable(f"{name} {_NATIVE} (the gateway cannot carry it to chat completions)", name)


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions body for a Responses API body (without ``model`` and ``stream``);
    :class:`NotBridgeable` naming the field when chat completions cannot express it."""
    _refuse_what_chat_cannot_say(body)
    out: dict[str, Any] = {"messages": _messages(body)}
    out.update({k: body[k] for k in SAME if body.get(k) is not None})
    # An empty tools array (the Agents SDK sends one for every agent without tools) is no tools:
    # chat completions refuse an empty array, and parallel_tool_calls without tools.
    tools = _tools(body["tools"]) if body.get("tools") is not None else []
    if tools:
        out["tools"] = tools
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("tool_choice") is not None:
        choice = _tool_choice(body["tool_choice"], bool(tools))
        if choice is not None:
            out["tool_choice"] = choice
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    out.update(_logprobs(body))
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort"):
        out["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    if isinstance(text, Mapping):
        fmt = text.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
            out["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
            out["response_format"] = {"type": "json_object"}
        elif isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text"):
            raise NotBridgeable(f"text.format of type {fmt.get('type')!r} {_NATIVE}", "text.format")
        if text.get("verbosity"):
            out["verbosity"] = text["verbosity"]
    return out


def _usage(u: object) -> dict[str, Any] | None:
    if not isinstance(u, Mapping):
        return None
    p, c = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    p, c = (p if isinstance(p, Mapping) else {}), (c if isinstance(c, Mapping) else {})
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "input_tokens_details": {
            "cached_tokens": p.get("cached_tokens", 0),
            "cache_write_tokens": p.get("cache_write_tokens", 0),
        },
        "output_tokens": u.get("completion_tokens", 0),
        "output_tokens_details": {"reasoning_tokens": c.get("reasoning_tokens", 0)},
        "total_tokens": u.get("total_tokens", 0),
    }


def _envelope(request: Mapping[str, Any], rid: str, created: int, model: str) -> dict[str, Any]:
    """The fields of a ``response`` object that echo the request."""
    text = request.get("text") if isinstance(request.get("text"), Mapping) else {"format": {"type": "text"}}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": model,
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning"),
        "store": False,
        "temperature": request.get("temperature"),
        "text": text,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_logprobs": request.get("top_logprobs"),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        **({"user": request["user"]} if isinstance(request.get("user"), str) else {}),
        "metadata": request.get("metadata") or {},
    }


def _text_part(text: str, logprobs: list | None = None, annotations: list | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": annotations or [], "logprobs": logprobs or []}


def _message_item(item_id: str, parts: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def _annotations(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chat's url citations in the Responses API's shape (the others have no counterpart)."""
    out = []
    for a in message.get("annotations") or ():
        cite = a.get("url_citation") if isinstance(a, Mapping) and a.get("type") == "url_citation" else None
        if isinstance(cite, Mapping):
            out.append(
                {"type": "url_citation", **{k: cite.get(k) for k in ("url", "title", "start_index", "end_index")}}
            )
    return out


def _token_logprobs(logprobs: object) -> list[dict[str, Any]]:
    """A chat choice's ``logprobs.content`` (the same entries the Responses API's ``logprobs`` hold)."""
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    return [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []


def _call_item(call: Mapping[str, Any], status: str = "completed") -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "type": "function_call",
        "id": f"fc_{call.get('id', '')}",
        "call_id": call.get("id", ""),
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments", "") if status == "completed" else "",
        "status": status,
    }


def _status(finish: object) -> tuple[str, dict | None]:
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def response_body(chat: Mapping[str, Any], request: Mapping[str, Any], model: str, *, now: float) -> dict[str, Any]:
    """The ``response`` object for a chat completion answer (choice 0): its text (with logprobs
    and citations) and refusal as the parts of one message item, then its tool calls. ``now``
    (wall-clock seconds, read by the caller) dates an answer that carries no ``created``."""
    cid = str(chat.get("id") or "")
    out = _envelope(request, f"resp_{cid}", int(chat.get("created") or now), model)
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        parts.append(_text_part(message["content"], _token_logprobs(choice.get("logprobs")), _annotations(message)))
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        items.append(_message_item(f"msg_{cid}", parts))
    for call in message.get("tool_calls") or []:
        items.append(_call_item(call))
    status, incomplete = _status(choice.get("finish_reason"))
    out.update(status=status, incomplete_details=incomplete, output=items)
    if (usage := _usage(chat.get("usage"))) is not None:
        out["usage"] = usage
    return out


class EventBridge:
    """A chat completions stream as the Responses API's semantic events: feed each chat chunk to
    :meth:`take`, then :meth:`end` at the end of the stream; each returns the events to send
    (``response.created`` ... ``response.completed``), numbered by ``sequence_number``.

    Choice 0's text (with its logprobs) and refusal become the content parts of one message item,
    a new part whenever the stream turns from one to the other (``response.output_text.delta`` /
    ``response.refusal.delta``); its tool calls become function call items."""

    def __init__(self, request: Mapping[str, Any], model: str, *, now: float):
        self.request = request
        self.model = model
        self.now = now  # wall-clock seconds at the attempt's start: dates a stream with no ``created``
        self.seq = 0
        self.started = False
        self.response: dict[str, Any] = {}
        self.msg_index: int | None = None  # the message item's output index, once text or a refusal came
        self.parts: list[dict[str, Any]] = []  # {"type": output_text | refusal, "pieces": [...], "logprobs": [...]}
        self.calls: dict[int, dict[str, Any]] = {}  # tool call index -> {output_index, id, name, args}
        self.next_index = 0
        self.finish: object = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _start(self, chunk: Mapping[str, Any], out: list[dict[str, Any]]) -> None:
        cid = str(chunk.get("id") or "")
        self.response = _envelope(self.request, f"resp_{cid}", int(chunk.get("created") or self.now), self.model)
        self.msg_id = f"msg_{cid}"
        out.append(self._event("response.created", response=dict(self.response)))
        out.append(self._event("response.in_progress", response=dict(self.response)))
        self.started = True

    def take(self, chunk: object) -> list[dict[str, Any]]:
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("choices"), list):
            raise BadResponse(f"malformed stream chunk from upstream: {str(chunk)[:80]!r}")
        out: list[dict[str, Any]] = []
        if not self.started:
            self._start(chunk, out)
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text, refusal = delta.get("content"), delta.get("refusal")
            logprobs = _token_logprobs(choice.get("logprobs"))
            if isinstance(text, str) and text:
                part = self._part("output_text", out)
                part["pieces"].append(text)
                part["logprobs"].extend(logprobs)
                out.append(self._event("response.output_text.delta", item_id=self.msg_id, output_index=self.msg_index,
                                       content_index=len(self.parts) - 1, delta=text, logprobs=logprobs))  # fmt: skip
            elif logprobs and self.parts and self.parts[-1]["type"] == "output_text":
                self.parts[-1]["logprobs"].extend(logprobs)
            if isinstance(refusal, str) and refusal:
                self._part("refusal", out)["pieces"].append(refusal)
                out.append(self._event("response.refusal.delta", item_id=self.msg_id, output_index=self.msg_index,
                                       content_index=len(self.parts) - 1, delta=refusal))  # fmt: skip
            for call in delta.get("tool_calls") or ():
                out.extend(self._call_delta(call))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def _part(self, kind: str, out: list[dict[str, Any]]) -> dict[str, Any]:
        """The message's content part of ``kind`` being streamed, opened (with the item) if need be."""
        if self.msg_index is None:
            self.msg_index = self.next_index
            self.next_index += 1
            item = _message_item(self.msg_id, [], "in_progress")
            out.append(self._event("response.output_item.added", output_index=self.msg_index, item=item))
        if not self.parts or self.parts[-1]["type"] != kind:
            self.parts.append({"type": kind, "pieces": [], "logprobs": []})
            empty = _text_part("") if kind == "output_text" else {"type": "refusal", "refusal": ""}
            out.append(self._event("response.content_part.added", item_id=self.msg_id, output_index=self.msg_index,
                                   content_index=len(self.parts) - 1, part=empty))  # fmt: skip
        return self.parts[-1]

    def _call_delta(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = []
        index = call.get("index", 0)
        fn = call.get("function") or {}
        state = self.calls.get(index)
        if state is None:
            state = {"output_index": self.next_index, "id": call.get("id") or "", "name": fn.get("name") or "",
                     "arguments": ""}  # fmt: skip
            self.next_index += 1
            self.calls[index] = state
            item = _call_item({"id": state["id"], "function": {"name": state["name"]}}, "in_progress")
            out.append(self._event("response.output_item.added", output_index=state["output_index"], item=item))
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            state["arguments"] += args
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=f"fc_{state['id']}",
                    output_index=state["output_index"],
                    delta=args,
                )
            )
        return out

    def end(self) -> list[dict[str, Any]]:
        """At the end of the chat stream: close every part and item and send ``response.completed``
        (or ``response.incomplete``) with the whole response and its usage."""
        out: list[dict[str, Any]] = []
        if not self.started:
            return out
        items: list[tuple[int, dict[str, Any]]] = []
        if self.msg_index is not None:
            where = {"item_id": self.msg_id, "output_index": self.msg_index}
            parts = []
            for n, p in enumerate(self.parts):
                whole = "".join(p["pieces"])
                if p["type"] == "output_text":
                    part = _text_part(whole, p["logprobs"])
                    out.append(self._event("response.output_text.done", **where, content_index=n, text=whole,
                                           logprobs=p["logprobs"]))  # fmt: skip
                else:
                    part = {"type": "refusal", "refusal": whole}
                    out.append(self._event("response.refusal.done", **where, content_index=n, refusal=whole))
                out.append(self._event("response.content_part.done", **where, content_index=n, part=part))
                parts.append(part)
            item = _message_item(self.msg_id, parts)
            out.append(self._event("response.output_item.done", output_index=self.msg_index, item=item))
            items.append((self.msg_index, item))
        for state in self.calls.values():
            call = {"id": state["id"], "function": {"name": state["name"], "arguments": state["arguments"]}}
            item = _call_item(call)
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=state["output_index"], name=state["name"],
                                   arguments=state["arguments"]))  # fmt: skip
            out.append(self._event("response.output_item.done", output_index=state["output_index"], item=item))
            items.append((state["output_index"], item))
        if self.finish is None:
            return out  # the upstream stream ended without a finish: the caller's stream is truncated
        status, incomplete = _status(self.finish)
        response = {**self.response, "status": status, "incomplete_details": incomplete,
                    "output": [item for _, item in sorted(items, key=lambda x: x[0])]}  # fmt: skip
        if self.usage is not None:
            response["usage"] = self.usage
        out.append(self._event(f"response.{status}", response=response))
        return out


class PassThrough:
    """The feed of a stream that needs no translation: each chunk as it is."""

    def take(self, chunk: object) -> list[Any]:
        return [chunk]

    def end(self) -> list[Any]:
        return []
