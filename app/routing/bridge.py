"""The Responses API on a provider that serves only chat completions, translated both ways, sans
I/O (LiteLLM's proxy has such a bridge): a ``POST /v1/responses`` body becomes a chat completions
body (:func:`chat_request`), the chat answer becomes a ``response`` object (:func:`response_body`),
and a chat stream becomes the Responses API's semantic events (:class:`EventBridge`). So the
Vercel AI SDK's default model and the OpenAI Agents SDK work through the gateway on any provider.

What chat completions cannot express is refused before any call, by name: a
``previous_response_id`` (chat is stateless; the gateway keeps no conversations) and built-in
tools (web search, file search, computer use). Everything else the caller sent that chat
completions also has (temperature, top_p, metadata, user, service_tier, ...) passes as it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from app.routing.errors import BadResponse
from core.errors import InvalidRequest

#: Responses fields with the same name and meaning in chat completions.
SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "top_logprobs",
)
#: Responses fields that say nothing to a chat upstream (the gateway answers for them).
DROPPED = frozenset({"store", "include", "background", "truncation", "stream_options", "input", "instructions"})


class NotBridgeable(InvalidRequest):
    """A Responses API request that chat completions cannot express."""


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
    raise NotBridgeable(f"content part type {kind!r} needs a provider that serves the Responses API")


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
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            continue  # a chat upstream has no use for another model's reasoning summary
        else:
            raise NotBridgeable(f"input item type {kind!r} needs a provider that serves the Responses API")
    return out


def _tools(tools: object) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest("tools must be a list")
    out = []
    for t in tools:
        if not isinstance(t, Mapping) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, Mapping) else type(t).__name__
            raise NotBridgeable(f"the built-in tool {kind!r} needs a provider that serves the Responses API")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions body for a Responses API body (without ``model`` and ``stream``)."""
    if body.get("previous_response_id"):
        raise NotBridgeable(
            "previous_response_id needs a provider that serves the Responses API (chat completions keep no "
            "conversation); send the whole conversation in input instead"
        )
    out: dict[str, Any] = {"messages": _messages(body)}
    out.update({k: body[k] for k in SAME if k in body})
    if "tools" in body:
        out["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    if "max_output_tokens" in body:
        out["max_completion_tokens"] = body["max_output_tokens"]
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
        if text.get("verbosity"):
            out["verbosity"] = text["verbosity"]
    return out


def _usage(u: object) -> dict[str, Any] | None:
    if not isinstance(u, Mapping):
        return None
    p, c = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    return {
        "input_tokens": u.get("prompt_tokens", 0),
        "input_tokens_details": {"cached_tokens": (p or {}).get("cached_tokens", 0) if isinstance(p, Mapping) else 0},
        "output_tokens": u.get("completion_tokens", 0),
        "output_tokens_details": {
            "reasoning_tokens": (c or {}).get("reasoning_tokens", 0) if isinstance(c, Mapping) else 0
        },
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
        "tools": request.get("tools", []),
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else [],
    }


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


def response_body(chat: Mapping[str, Any], request: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The ``response`` object for a chat completion answer (choice 0)."""
    cid = str(chat.get("id") or "")
    out = _envelope(request, f"resp_{cid}", int(chat.get("created") or time.time()), model)
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        items.append(_message_item(f"msg_{cid}", message["content"]))
    for call in message.get("tool_calls") or []:
        items.append(_call_item(call))
    status, incomplete = _status(choice.get("finish_reason"))
    out.update(status=status, incomplete_details=incomplete, output=items, usage=_usage(chat.get("usage")))
    return out


class EventBridge:
    """A chat completions stream as the Responses API's semantic events: feed each chat chunk to
    :meth:`take`, then :meth:`finish` at the end of the stream; each returns the events to send
    (``response.created`` ... ``response.completed``), numbered by ``sequence_number``."""

    def __init__(self, request: Mapping[str, Any], model: str):
        self.request = request
        self.model = model
        self.seq = 0
        self.started = False
        self.response: dict[str, Any] = {}
        self.text: list[str] = []
        self.text_index: int | None = None  # the message item's output index, once text came
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
        self.response = _envelope(self.request, f"resp_{cid}", int(chunk.get("created") or time.time()), self.model)
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
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.text_index is None:
                    self.text_index = self.next_index
                    self.next_index += 1
                    out.append(
                        self._event(
                            "response.output_item.added",
                            output_index=self.text_index,
                            item=_message_item(self.msg_id, "", "in_progress"),
                        )
                    )
                    out.append(
                        self._event(
                            "response.content_part.added",
                            item_id=self.msg_id,
                            output_index=self.text_index,
                            content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []},
                        )
                    )
                self.text.append(text)
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=self.msg_id,
                        output_index=self.text_index,
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                )
            for call in delta.get("tool_calls") or ():
                out.extend(self._call_delta(call))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

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
        """At the end of the chat stream: close every item and send ``response.completed`` (or
        ``response.incomplete``) with the whole response and its usage."""
        out: list[dict[str, Any]] = []
        if not self.started:
            return out
        items: list[tuple[int, dict[str, Any]]] = []
        if self.text_index is not None:
            text = "".join(self.text)
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self._event("response.output_text.done", item_id=self.msg_id, output_index=self.text_index,
                                   content_index=0, text=text, logprobs=[]))  # fmt: skip
            out.append(self._event("response.content_part.done", item_id=self.msg_id, output_index=self.text_index,
                                   content_index=0, part=part))  # fmt: skip
            item = _message_item(self.msg_id, text)
            out.append(self._event("response.output_item.done", output_index=self.text_index, item=item))
            items.append((self.text_index, item))
        for state in self.calls.values():
            call = {"id": state["id"], "function": {"name": state["name"], "arguments": state["arguments"]}}
            item = _call_item(call)
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=state["output_index"], arguments=state["arguments"]))  # fmt: skip
            out.append(self._event("response.output_item.done", output_index=state["output_index"], item=item))
            items.append((state["output_index"], item))
        if self.finish is None:
            return out  # the upstream stream ended without a finish: the caller's stream is truncated
        status, incomplete = _status(self.finish)
        response = {**self.response, "status": status, "incomplete_details": incomplete,
                    "output": [item for _, item in sorted(items, key=lambda x: x[0])], "usage": self.usage}  # fmt: skip
        out.append(self._event(f"response.{status}", response=response))
        return out


class PassThrough:
    """The feed of a stream that needs no translation: each chunk as it is."""

    def take(self, chunk: object) -> list[Any]:
        return [chunk]

    def end(self) -> list[Any]:
        return []
