"""A scripted chaos upstream on loopback: an OpenAI-compatible HTTP server whose every answer is chosen
by the test, for the faults that real upstreams and gateways produce during incidents.

    with ChaosUpstream() as up:
        up.script(unavailable("bad \\udcff thing"), rate_limited(retry_after_s=2), ok())
        client = openai.OpenAI(base_url=up.base_url(), api_key="k", max_retries=0)
        ...
        assert [r.path for r in up.requests] == [...]

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
    "completion_body",
    "context_length",
    "empty_choices",
    "error",
    "hang",
    "hang_until_closed",
    "html_200",
    "huge",
    "invalid_parameter",
    "json_array_200",
    "litellm_invalid_model",
    "litellm_no_db",
    "mid_stream_drop",
    "null_choices",
    "ok",
    "rate_limited",
    "raw",
    "redirect",
    "reset",
    "server_error",
    "stall_after",
    "stream_null_choices",
    "trickle",
    "unauthorized_echo",
    "unavailable",
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

    def start_chunked(self, status: int, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
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
