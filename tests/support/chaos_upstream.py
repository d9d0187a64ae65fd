"""A scripted chaos upstream on loopback: an OpenAI-compatible HTTP server whose every answer is chosen
by the test, for the faults that real upstreams and gateways produce during incidents.

    with ChaosUpstream() as up:
        up.script(unavailable("bad \\udcff thing"), rate_limited(retry_after_s=2), ok())
        client = openai.OpenAI(base_url=up.base_url(), api_key="k", max_retries=0)
        ...
        assert [r.path for r in up.requests] == [...]

Besides the faults, :func:`reply` (any JSON answer, status and headers) and :func:`sse` (any stream
of JSON chunks, with named ``event:`` lines for the Responses API) play scripted *valid* answers; the
``*_body`` / ``*_chunks`` / ``*_events`` builders make the common real ones (tool calls and their
streamed deltas, n=2 interleaved, logprobs, refusal, reasoning usage, embeddings, legacy completions,
the Responses API object and its event sequence, models), shaped as the official OpenAPI schema says.
Any path is served (``/NAME/v1/chat/completions``, ``.../responses``, ``.../embeddings``,
``.../completions``, ``.../models/ID``); what a fault answers is up to the fault.

Requests are served in arrival order from a queue of faults (one per request), per *provider* (the
first path segment of ``/NAME/v1/...``; plain ``/v1/...`` is provider ``""``). When a queue is empty
the provider's default answers (:func:`ok` unless set). Every request is recorded (method, path,
headers, body, the fault that served it) before it is answered.

The server is a ``ThreadingHTTPServer`` on 127.0.0.1 port 0 speaking HTTP/1.1 (keep-alive, chunked SSE,
so a dropped stream is a protocol error, as on the wire). :meth:`ChaosUpstream.stop` releases every
hanging or trickling handler, shuts every open connection and joins every handler thread, so a test
leaves no thread behind.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ChaosUpstream",
    "Fault",
    "RecordedRequest",
    "bad_json",
    "bad_request",
    "chat_body",
    "chat_chunk",
    "choice",
    "completion_body",
    "context_length",
    "embeddings_body",
    "empty_choices",
    "error",
    "function_call_item",
    "hang",
    "hang_until_closed",
    "html_200",
    "huge",
    "interleaved_chunks",
    "invalid_parameter",
    "json_array_200",
    "litellm_invalid_model",
    "litellm_no_db",
    "logprobs_body",
    "message_item",
    "mid_stream_drop",
    "model_body",
    "models_body",
    "null_choices",
    "ok",
    "openai_like",
    "rate_limited",
    "raw",
    "redirect",
    "refusal_body",
    "reply",
    "reset",
    "response_body",
    "response_events",
    "server_error",
    "sse",
    "stall_after",
    "stream_null_choices",
    "text_chunks",
    "text_completion_body",
    "tool_call",
    "tool_call_body",
    "tool_call_chunks",
    "trickle",
    "unauthorized_echo",
    "unavailable",
    "usage",
]

DEFAULT_MODEL = "chaos-model"


@dataclass
class RecordedRequest:
    method: str
    path: str
    provider: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    fault: str = ""  # name of the fault that served it
    # Set once the fault's handler has returned (answered, or found the connection closed).
    served: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def wants_stream(self) -> bool:
        try:
            body = self.json
        except ValueError:
            return False
        return isinstance(body, dict) and bool(body.get("stream"))

    @property
    def model(self) -> str:
        try:
            body = self.json
        except ValueError:
            body = None
        return str(body.get("model") or DEFAULT_MODEL) if isinstance(body, dict) else DEFAULT_MODEL


@dataclass(frozen=True)
class Fault:
    """One scripted answer: ``serve(handler, request)`` writes it (or refuses to)."""

    name: str
    serve: Callable[[_Handler, RecordedRequest], None] = field(repr=False)


# -- bodies ------------------------------------------------------------------------------------------
def completion_body(
    model: str, text: str, *, prompt_tokens: int = 5, completion_tokens: int | None = None, cached_tokens: int = 0
) -> dict:
    completion = completion_tokens if completion_tokens is not None else max(1, len(text.split()))
    return {
        "id": "chatcmpl-chaos",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": _usage(prompt_tokens, completion, cached_tokens),
    }


def _usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _chunk(model: str, choices: Any, usage: dict | None = None) -> dict:
    body = {"id": "chatcmpl-chaos", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    body["choices"] = choices
    if usage is not None:
        body["usage"] = usage
    return body


def _sse(obj: Any) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {data}\n\n".encode()


def _stream_events(model: str, text: str, prompt_tokens: int) -> list[bytes]:
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    events = [_sse(_chunk(model, [{"index": 0, "delta": {"role": "assistant", "content": ""}}]))]
    events += [_sse(_chunk(model, [{"index": 0, "delta": {"content": p}}])) for p in pieces]
    events.append(_sse(_chunk(model, [{"index": 0, "delta": {}, "finish_reason": "stop"}])))
    events.append(_sse(_chunk(model, [], _usage(prompt_tokens, len(pieces), 0))))
    events.append(_sse("[DONE]"))
    return events


def _error_body(message: str, type_: str, code: str | int | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# -- faults: valid answers ---------------------------------------------------------------------------
def ok(text: str = "chaos says hello", *, prompt_tokens: int = 5, cached_tokens: int = 0) -> Fault:
    """A valid answer: a completion, an SSE stream with a usage chunk when the request asks to stream,
    or a model list for ``GET .../models``."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        if req.path.rstrip("/").endswith("/models"):
            h.send_json(200, {"object": "list", "data": [{"id": DEFAULT_MODEL, "object": "model"}]})
        elif req.wants_stream:
            h.start_chunked(200, "text/event-stream")
            for event in _stream_events(req.model, text, prompt_tokens):
                h.write_chunk(event)
            h.end_chunked()
        else:
            body = completion_body(req.model, text, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens)
            h.send_json(200, body)

    return Fault("ok", serve)


# -- faults: HTTP errors -----------------------------------------------------------------------------
def error(
    status: int,
    message: str,
    *,
    type_: str = "api_error",
    code: str | int | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Fault:
    """An OpenAI error object with ``status``. The message is JSON-encoded with ASCII escapes, so a
    lone surrogate in it arrives as the six characters ``\\udcff``, as from a real upstream."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.send_json(status, _error_body(message, type_, code, param), headers)

    return Fault(name or f"error_{status}", serve)


def unavailable(message: str = "upstream unavailable") -> Fault:
    return error(503, message, type_="service_unavailable", name="unavailable_503")


def server_error(message: str = "internal server error") -> Fault:
    return error(500, message, type_="server_error", name="server_error_500")


def rate_limited(
    *, retry_after_s: float | str | None = None, retry_after_ms: float | str | None = None, message: str = ""
) -> Fault:
    headers = {}
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s)
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    text = message or "Rate limit reached for requests"
    return error(429, text, type_="requests", code="rate_limit_exceeded", headers=headers, name="rate_limited_429")


def unauthorized_echo() -> Fault:
    """401 whose message echoes the Authorization header the caller sent (as some upstreams do)."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        echoed = req.headers.get("authorization", "")
        body = _error_body(f"Incorrect API key provided: {echoed}", "invalid_request_error", "invalid_api_key")
        h.send_json(401, body)

    return Fault("unauthorized_401", serve)


def bad_request(message: str, *, code: str | int | None = None, param: str | None = None) -> Fault:
    return error(400, message, type_="invalid_request_error", code=code, param=param, name="bad_request_400")


def litellm_invalid_model(model: str = "gpt-4.1") -> Fault:
    """LiteLLM proxy's answer for a model it does not route: a 400 that is about the route."""
    message = (
        f"litellm.BadRequestError: Invalid model name passed in model={model}. "
        "Call `/v1/models` to view available models for your key."
    )
    return error(400, message, type_="invalid_request_error", code="400", param="model", name="litellm_invalid_model")


def litellm_no_db() -> Fault:
    """LiteLLM proxy misconfigured (virtual keys without a database): a 400 that is about the gateway."""
    return error(400, "No connected db.", type_="no_db_connection", code="400", name="litellm_no_db")


def context_length(limit: int = 128000, got: int = 200000) -> Fault:
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages resulted in {got} "
        "tokens. Please reduce the length of the messages."
    )
    return error(
        400, message, type_="invalid_request_error", code="context_length_exceeded", param="messages",
        name="context_length_400",
    )  # fmt: skip


def invalid_parameter(param: str = "temperature") -> Fault:
    message = f"Invalid value for '{param}': expected a number between 0 and 2."
    return error(
        400, message, type_="invalid_request_error", code="invalid_value", param=param, name="invalid_parameter_400"
    )


def redirect(location: str = "http://127.0.0.1:9/v1/chat/completions", status: int = 307) -> Fault:
    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.send_raw(status, b"", "text/plain", {"location": location})

    return Fault(f"redirect_{status}", serve)


# -- faults: the connection itself -------------------------------------------------------------------
def hang() -> Fault:
    """Read the request, never answer; released (connection closed, no response) when the server stops."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.server.stopping.wait()
        h.abort(reset=False)

    return Fault("hang", serve)


def _until_closed(h: _Handler) -> None:
    """Wait, sending nothing, until the client closes the connection (or the server stops)."""
    h.connection.settimeout(0.05)
    while not h.server.stopping.is_set():
        try:
            if not h.connection.recv(1):
                break  # end of file: the client closed the connection
        except TimeoutError:
            continue
        except OSError:
            break
    h.abort(reset=False)


def hang_until_closed() -> Fault:
    """Read the request, never answer, and end as soon as the client closes the connection (or the
    server stops): the request's ``served`` event then says the client gave up on it."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        _until_closed(h)

    return Fault("hang_until_closed", serve)


def stall_after(events: int, *, text: str = "one two three four five six") -> Fault:
    """A 200 SSE stream that sends its first ``events`` events, then nothing, until the client closes
    the connection (or the server stops): the request's ``served`` event then says the client gave up."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.start_chunked(200, "text/event-stream")
        for event in _stream_events(req.model, text, 5)[:events]:
            h.write_chunk(event)
        _until_closed(h)

    return Fault("stall_after", serve)


def reset() -> Fault:
    """Close the socket abruptly (RST, via SO_LINGER 0) instead of answering."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.abort(reset=True)

    return Fault("reset", serve)


def mid_stream_drop(after_chunks: int = 2, *, text: str = "one two three four five six", rst: bool = False) -> Fault:
    """A 200 SSE stream that stops after ``after_chunks`` events: no finish reason, no ``[DONE]``, no
    terminating chunk; the connection is closed (FIN, or RST with ``rst=True``)."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.start_chunked(200, "text/event-stream")
        for event in _stream_events(req.model, text, 5)[:after_chunks]:
            h.write_chunk(event)
        h.abort(reset=rst)

    return Fault("mid_stream_drop", serve)


# -- faults: malformed 200s --------------------------------------------------------------------------
def raw(status: int, body: bytes | str, content_type: str, *, name: str = "raw") -> Fault:
    data = body.encode() if isinstance(body, str) else body

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.send_raw(status, data, content_type)

    return Fault(name, serve)


def bad_json() -> Fault:
    return raw(200, '{"id": "chatcmpl-chaos", "choices": [{"message": ', "application/json", name="bad_json")


def html_200() -> Fault:
    page = "<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>"
    return raw(200, page, "text/html; charset=utf-8", name="html_200")


def json_array_200() -> Fault:
    return raw(200, json.dumps([{"error": "unexpected"}]), "application/json", name="json_array_200")


def _choices_fault(value: Any, name: str) -> Fault:
    def serve(h: _Handler, req: RecordedRequest) -> None:
        if req.wants_stream:
            h.start_chunked(200, "text/event-stream")
            h.write_chunk(_sse(_chunk(req.model, value, _usage(5, 0, 0))))
            h.write_chunk(_sse("[DONE]"))
            h.end_chunked()
        else:
            body = completion_body(req.model, "")
            body["choices"] = value
            h.send_json(200, body)

    return Fault(name, serve)


def empty_choices() -> Fault:
    """A 200 completion (or stream) whose ``choices`` is ``[]``."""
    return _choices_fault([], "empty_choices")


def null_choices() -> Fault:
    """A 200 completion (or stream) whose ``choices`` is ``null``."""
    return _choices_fault(None, "null_choices")


def stream_null_choices(text: str = "half an answer") -> Fault:
    """A stream whose first content chunks are valid, then a chunk with ``"choices": null``."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.start_chunked(200, "text/event-stream")
        events = _stream_events(req.model, text, 5)
        h.write_chunk(events[0])
        h.write_chunk(_sse(_chunk(req.model, None)))
        for event in events[1:]:
            h.write_chunk(event)
        h.end_chunked()

    return Fault("stream_null_choices", serve)


# -- faults: slow and big ----------------------------------------------------------------------------
def trickle(interval_s: float = 0.05, *, text: str = "slow but steady") -> Fault:
    """A valid completion sent one byte every ``interval_s`` (headers at once): no single read ever
    waits longer than ``interval_s``, so only an overall deadline bounds the request. A streaming
    request gets its SSE events the same way, one byte per chunk. Stops early (connection closed)
    when the server stops."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        if req.wants_stream:
            data = b"".join(_stream_events(req.model, text, 5))
            h.start_chunked(200, "text/event-stream")
            send = h.write_chunk
        else:
            data = json.dumps(completion_body(req.model, text)).encode()
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(data)))
            h.end_headers()
            send = h.wfile.write
        for i in range(len(data)):
            if i and h.server.stopping.wait(interval_s):
                h.abort(reset=False)
                return
            send(data[i : i + 1])
        if req.wants_stream:
            h.end_chunked()

    return Fault("trickle", serve)


def huge(size_bytes: int = 50 * 1024 * 1024, *, chunked: bool = False) -> Fault:
    """A valid 200 completion whose content makes the body about ``size_bytes``, written in 1 MiB
    pieces (never held in memory at once); ``chunked``: with no Content-Length (the size is only
    known by reading)."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        marker = "@@FILL@@"
        head, tail = json.dumps(completion_body(req.model, marker)).encode().split(marker.encode())
        fill = max(0, size_bytes - len(head) - len(tail))
        if chunked:
            h.start_chunked(200, "application/json")
            write = h.write_chunk
        else:
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(len(head) + fill + len(tail)))
            h.end_headers()
            write = h.wfile.write
        write(head)
        piece = b"a" * (1024 * 1024)
        left = fill
        while left > 0:
            if h.server.stopping.is_set():
                h.abort(reset=False)
                return
            n = min(left, len(piece))
            write(piece[:n])
            left -= n
        write(tail)
        if chunked:
            h.end_chunked()

    return Fault("huge", serve)


# -- scripted answers: any body, any stream ----------------------------------------------------------
# Fixed, so that a test can compare what the client got with what the upstream sent, field by field.
CREATED = 1764547200
FINGERPRINT = "fp_chaos_0001"

Body = Any  # a JSON value, or a function of the RecordedRequest returning one


def _resolve(body: Body, req: RecordedRequest) -> Any:
    return body(req) if callable(body) else body


def reply(body: Body, *, status: int = 200, headers: Mapping[str, str] | None = None, name: str = "reply") -> Fault:
    """Any JSON answer (or a function of the request that returns one), with ``status`` and extra
    ``headers`` (e.g. ``x-ratelimit-remaining-requests``, ``openai-processing-ms``)."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.send_json(status, _resolve(body, req), headers)

    return Fault(name, serve)


def _is_usage_chunk(event: Any) -> bool:
    return isinstance(event, dict) and event.get("choices") == [] and event.get("usage") is not None


def _asked_for_usage(req: RecordedRequest) -> bool:
    try:
        body = req.json
    except ValueError:
        return False
    options = body.get("stream_options") if isinstance(body, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True


def sse(
    events: Body,
    *,
    named: bool = False,
    done: bool | None = None,
    usage_if_asked: bool = True,
    headers: Mapping[str, str] | None = None,
    hold_after: int | None = None,
    release: threading.Event | None = None,
    name: str = "sse",
) -> Fault:
    """A 200 ``text/event-stream`` of ``events`` (JSON objects, or a function of the request returning
    them), one ``data:`` line each, in order, each in its own HTTP chunk.

    ``named``: each event is preceded by ``event: <its "type">`` (the Responses API's framing); a
    ``(event_name, obj)`` pair names one event explicitly. ``done``: end with ``data: [DONE]`` (chat and
    completions streams do, the Responses API does not; default: not ``named``). ``usage_if_asked``:
    the usage-only chunk (``choices == []`` with ``usage``) is sent only when the request asked for it
    with ``stream_options.include_usage``, as OpenAI does. ``hold_after`` / ``release``: after that many
    events, wait until ``release`` is set (or the server stops; at most 30 s) before the rest, so a
    test can see the first events arrive while the upstream is still answering."""
    end = (not named) if done is None else done

    def serve(h: _Handler, req: RecordedRequest) -> None:
        h.start_chunked(200, "text/event-stream", headers)
        for n, event in enumerate(_resolve(events, req)):
            if n == hold_after and release is not None:
                deadline = time.monotonic() + 30.0
                while not release.wait(0.05) and not h.server.stopping.is_set() and time.monotonic() < deadline:
                    pass
            if usage_if_asked and _is_usage_chunk(event) and not _asked_for_usage(req):
                continue
            label = None
            if isinstance(event, tuple):
                label, event = event
            elif named and isinstance(event, dict):
                label = event.get("type")
            data = json.dumps(event)
            h.write_chunk((f"event: {label}\n" if label else "").encode() + f"data: {data}\n\n".encode())
        if end:
            h.write_chunk(_sse("[DONE]"))
        h.end_chunked()

    return Fault(name, serve)


def openai_like(text: str = "Hello from the scripted upstream.") -> Fault:
    """A schema-valid answer for whatever endpoint the request names, echoing its ``model``: chat
    (plain or streamed), Responses (plain or streamed events), embeddings (one 3-vector per input),
    legacy completions, ``GET .../models`` and ``GET .../models/ID``."""

    def serve(h: _Handler, req: RecordedRequest) -> None:
        path = req.path.split("?", 1)[0].rstrip("/")
        body = req.json if req.body else {}
        model = req.model
        if "/models/" in path:
            fault = reply(model_body(path.rsplit("/", 1)[1]))
        elif path.endswith("/models"):
            fault = reply(models_body([model]))
        elif path.endswith("/responses"):
            fault = (
                sse(response_events(model, text), named=True) if req.wants_stream else reply(response_body(model, text))
            )
        elif path.endswith("/embeddings"):
            inputs = body.get("input") if isinstance(body, dict) else None
            count = len(inputs) if isinstance(inputs, list) and not all(isinstance(i, int) for i in inputs) else 1
            fault = reply(embeddings_body(model, [[0.01 * i, 0.5, -0.25] for i in range(count)]))
        elif path.endswith("/completions") and not path.endswith("/chat/completions"):
            fault = reply(text_completion_body(model, [text]))
        elif req.wants_stream:
            fault = sse(text_chunks(model, text))
        else:
            fault = reply(chat_body(model, [choice(content=text)]))
        fault.serve(h, req)

    return Fault("openai_like", serve)


# -- builders: chat completions ----------------------------------------------------------------------
def usage(
    prompt: int = 12,
    completion: int = 7,
    *,
    cached: int = 0,
    reasoning: int = 0,
    audio: int = 0,
    accepted_prediction: int = 0,
    rejected_prediction: int = 0,
) -> dict:
    """A chat ``usage`` with both detail objects, as OpenAI sends it."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": audio,
            "accepted_prediction_tokens": accepted_prediction,
            "rejected_prediction_tokens": rejected_prediction,
        },
    }


def tool_call(call_id: str, name: str, arguments: str | Mapping[str, Any]) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def choice(
    index: int = 0,
    *,
    content: str | None = "Hello from the scripted upstream.",
    tool_calls: list[dict] | None = None,
    refusal: str | None = None,
    logprobs: dict | None = None,
    finish_reason: str = "stop",
    annotations: list | None = None,
) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    message["annotations"] = annotations if annotations is not None else []
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_body(
    model: str,
    choices: list[dict] | None = None,
    *,
    usage_: dict | None = None,
    system_fingerprint: str | None = FINGERPRINT,
    service_tier: str | None = "default",
    id_: str = "chatcmpl-scripted",
) -> dict:
    """A ``chat.completion`` (default: one plain text choice) with full usage."""
    body: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": choices if choices is not None else [choice()],
        "usage": usage_ if usage_ is not None else usage(),
        "service_tier": service_tier,
    }
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    return body


def tool_call_body(model: str, calls: list[dict], *, content: str | None = None) -> dict:
    """The assistant calling ``calls`` (see :func:`tool_call`): content null, finish ``tool_calls``."""
    return chat_body(model, [choice(content=content, tool_calls=calls, finish_reason="tool_calls")])


def refusal_body(model: str, refusal: str = "I'm sorry, I can't help with that.") -> dict:
    return chat_body(model, [choice(content=None, refusal=refusal)])


def _logprob(token: str, logprob: float, alternatives: list[tuple[str, float]]) -> dict:
    def entry(t: str, lp: float) -> dict:
        return {"token": t, "logprob": lp, "bytes": list(t.encode())}

    return {**entry(token, logprob), "top_logprobs": [entry(t, lp) for t, lp in alternatives]}


def logprobs_body(model: str) -> dict:
    """A completion whose choice carries token logprobs with two top alternatives per token."""
    content = [
        _logprob("Hello", -0.0031, [("Hello", -0.0031), ("Hi", -5.91)]),
        _logprob("!", -0.25, [("!", -0.25), (".", -1.5)]),
    ]
    return chat_body(model, [choice(content="Hello!", logprobs={"content": content, "refusal": None})])


def chat_chunk(
    model: str, choices: list[dict], *, usage_: dict | None = None, system_fingerprint: str | None = FINGERPRINT
) -> dict:
    body: dict[str, Any] = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": model,
        "service_tier": "default",
        "choices": choices,
    }
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    if usage_ is not None:
        body["usage"] = usage_
    return body


def _delta(index: int, delta: dict, finish_reason: str | None = None) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def text_chunks(model: str, text: str = "Hello from the scripted upstream.", *, usage_: dict | None = None) -> list:
    """A streamed text answer: role, one chunk per word, finish ``stop``, then the usage chunk."""
    chunks = [chat_chunk(model, [_delta(0, {"role": "assistant", "content": "", "refusal": None})])]
    chunks += [chat_chunk(model, [_delta(0, {"content": p})]) for p in _pieces(text)]
    chunks.append(chat_chunk(model, [_delta(0, {}, "stop")]))
    chunks.append(chat_chunk(model, [], usage_=usage_ or usage(completion=len(_pieces(text)))))
    return chunks


def _fragments(s: str, n: int) -> list[str]:
    step = max(1, -(-len(s) // n))
    return [s[i : i + step] for i in range(0, len(s), step)] or [""]


def tool_call_chunks(model: str, calls: list[dict], *, fragments: int = 3, usage_: dict | None = None) -> list:
    """The streamed form of :func:`tool_call_body`, as OpenAI sends it: the role, then per call a chunk
    with its index, id, type and name (arguments ``""``), then its arguments in ``fragments`` pieces
    (index only), then finish ``tool_calls`` and the usage chunk."""
    chunks = [chat_chunk(model, [_delta(0, {"role": "assistant", "content": None, "refusal": None})])]
    for i, call in enumerate(calls):
        head = {"index": i, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        chunks.append(chat_chunk(model, [_delta(0, {"tool_calls": [head]})]))
        for piece in _fragments(call["function"]["arguments"], fragments):
            frag = {"index": i, "function": {"arguments": piece}}
            chunks.append(chat_chunk(model, [_delta(0, {"tool_calls": [frag]})]))
    chunks.append(chat_chunk(model, [_delta(0, {}, "tool_calls")]))
    chunks.append(chat_chunk(model, [], usage_=usage_ or usage()))
    return chunks


def interleaved_chunks(model: str, texts: list[str], *, usage_: dict | None = None) -> list:
    """``n=len(texts)`` choices streamed interleaved: each index's role, then word k of every choice
    in turn, then each index's finish, then the usage chunk."""
    pieces = [_pieces(t) for t in texts]
    chunks = [chat_chunk(model, [_delta(i, {"role": "assistant", "content": ""})]) for i in range(len(texts))]
    for k in range(max(len(p) for p in pieces)):
        for i, p in enumerate(pieces):
            if k < len(p):
                chunks.append(chat_chunk(model, [_delta(i, {"content": p[k]})]))
    chunks += [chat_chunk(model, [_delta(i, {}, "stop")]) for i in range(len(texts))]
    chunks.append(chat_chunk(model, [], usage_=usage_ or usage(completion=sum(len(p) for p in pieces))))
    return chunks


# -- builders: the other endpoints -------------------------------------------------------------------
def embeddings_body(model: str, vectors: list[list[float]], *, prompt_tokens: int = 8) -> dict:
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def text_completion_body(model: str, texts: list[str], *, finish_reason: str = "stop") -> dict:
    """A legacy ``text_completion`` (``POST /v1/completions``), one choice per text."""
    choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": finish_reason} for i, t in enumerate(texts)]
    return {
        "id": "cmpl-scripted",
        "object": "text_completion",
        "created": CREATED,
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10},
    }


def model_body(model_id: str, *, owned_by: str = "chaos") -> dict:
    return {"id": model_id, "object": "model", "created": CREATED, "owned_by": owned_by}


def models_body(ids: list[str]) -> dict:
    return {"object": "list", "data": [model_body(i) for i in ids]}


def message_item(text: str, *, item_id: str = "msg_scripted", status: str = "completed") -> dict:
    """A Responses API output message with one ``output_text`` part."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def function_call_item(
    call_id: str,
    name: str,
    arguments: str | Mapping[str, Any],
    *,
    item_id: str = "fc_scripted",
    status: str = "completed",
) -> dict:
    """A Responses API ``function_call`` output item."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


def _response_usage(input_tokens: int = 11, output_tokens: int = 9, reasoning: int = 0) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def response_body(
    model: str,
    output: list[dict] | str = "Hello from the scripted upstream.",
    *,
    status: str = "completed",
    usage_: dict | None = None,
    response_id: str = "resp_scripted",
) -> dict:
    """A Responses API ``response`` object; ``output`` is a list of items or the text of one message."""
    items = [message_item(output)] if isinstance(output, str) else output
    done = status == "completed"
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": CREATED,
        "completed_at": CREATED + 1 if done else None,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": items,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "metadata": {},
    }
    if done:  # the schema's ``usage`` is not nullable: a response still in progress has none
        body["usage"] = usage_ or _response_usage()
    return body


def response_events(model: str, output: list[dict] | str = "Hello from the scripted upstream.") -> list[dict]:
    """The full streamed event sequence of :func:`response_body` as OpenAI sends it: created,
    in_progress; per item output_item.added, then (messages) content_part.added, output_text.delta per
    word, output_text.done, content_part.done, or (function calls) function_call_arguments.delta in
    pieces and .done; output_item.done; finally completed. Numbered by ``sequence_number``."""
    final = response_body(model, output)
    pending = response_body(model, [], status="in_progress")
    events: list[dict] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            events.append(
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "content": []}}
            )  # fmt: skip
            for c, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": index, "content_index": c}
                events.append({"type": "response.content_part.added", **where, "part": {**part, "text": ""}})
                for piece in _pieces(part["text"]):
                    events.append({"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []})
                events.append({"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []})
                events.append({"type": "response.content_part.done", **where, "part": part})
        elif item["type"] == "function_call":
            events.append(
                {"type": "response.output_item.added", "output_index": index,
                 "item": {**item, "status": "in_progress", "arguments": ""}}
            )  # fmt: skip
            where = {"item_id": item["id"], "output_index": index}
            for piece in _fragments(item["arguments"], 3):
                events.append({"type": "response.function_call_arguments.delta", **where, "delta": piece})
            events.append(
                {"type": "response.function_call_arguments.done", **where, "name": item["name"],
                 "arguments": item["arguments"]}
            )  # fmt: skip
        else:
            events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": final})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


# -- the server --------------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests assert on .requests
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        provider = parts[0] if len(parts) > 1 and parts[0] != "v1" else ""
        req = RecordedRequest(self.command, self.path, provider, {k.lower(): v for k, v in self.headers.items()}, body)
        fault = self.server.chaos.take(provider)
        req.fault = fault.name
        self.server.chaos.record(req)
        try:
            fault.serve(self, req)
        except OSError:
            self.close_connection = True  # the client went away or stop() shut the socket
        finally:
            req.served.set()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    # helpers used by faults
    def send_raw(self, status: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send_raw(status, json.dumps(obj).encode("ascii"), "application/json", headers)

    def start_chunked(self, status: int, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def abort(self, *, reset: bool) -> None:
        """Drop the connection now: RST with ``reset``, else FIN, without finishing any response."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # rfile holds a reference to the socket; close it first so close() really closes the fd.
        self.rfile.close()
        self.connection.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close() joins every handler thread

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that reset its connection (the gateway cutting an answer short) is expected
        here, not an error; anything else is printed as socketserver prints it."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def __init__(self, chaos: ChaosUpstream):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.chaos = chaos
        self.stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def shut_open_connections(self) -> None:
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by a fault


class ChaosUpstream:
    """The scripted loopback upstream. Use as a context manager, or :meth:`start` / :meth:`stop`."""

    def __init__(self, default: Fault | None = None):
        self._lock = threading.Condition()
        self._queues: dict[str, deque[Fault]] = {}
        self._defaults: dict[str, Fault] = {}
        self._default = default or ok()
        self.requests: list[RecordedRequest] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> ChaosUpstream:
        if self._server is not None:
            raise RuntimeError("ChaosUpstream already started")
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="chaos-upstream", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hanging handlers, close every connection, join every thread. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stopping.set()
        server.shutdown()
        server.shut_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ChaosUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # addresses
    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ChaosUpstream is not running")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def base_url(self, provider: str = "") -> str:
        """The OpenAI ``base_url`` for ``provider`` (``.../NAME/v1``, or ``.../v1`` for ``""``)."""
        return f"{self.url}/{provider}/v1" if provider else f"{self.url}/v1"

    # scripting
    def script(self, *faults: Fault, provider: str = "") -> ChaosUpstream:
        """Queue ``faults`` for the next requests to ``provider``, one each, in order."""
        with self._lock:
            self._queues.setdefault(provider, deque()).extend(faults)
        return self

    def set_default(self, fault: Fault, provider: str | None = None) -> None:
        """What answers when ``provider``'s queue is empty (``None``: every provider without its own)."""
        with self._lock:
            if provider is None:
                self._default = fault
            else:
                self._defaults[provider] = fault

    def pending(self, provider: str = "") -> int:
        with self._lock:
            return len(self._queues.get(provider, ()))

    def take(self, provider: str) -> Fault:
        with self._lock:
            queue = self._queues.get(provider)
            if queue:
                return queue.popleft()
            return self._defaults.get(provider, self._default)

    # records
    def record(self, req: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(req)
            self._lock.notify_all()

    def requests_for(self, provider: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.provider == provider]

    def wait_for_requests(self, n: int, timeout_s: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests have arrived (or ``TimeoutError``)."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= n, timeout_s):
                raise TimeoutError(f"chaos upstream saw {len(self.requests)} of {n} requests in {timeout_s}s")
            return list(self.requests)
