"""Reading upstream answers, sans I/O: a non-streamed answer of each API from its bytes
(:func:`read_answer`), a stream chunk by chunk (:class:`StreamAccount`), only as far as the
gateway's accounting and validation need: usage (with cached and reasoning tokens), finish reason,
first-output time, tool calls and text. A 200 that is not an answer of the API asked is a
:class:`~app.routing.errors.BadResponse`. The answer itself is kept whole, ``model`` set to the
model routed to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from app.routing.errors import BadResponse
from app.routing.policy import AttemptDeadline
from app.routing.result import Deferred, Usage
from core import fastjson
from core.quality import AnswerQuality

#: Upstream response headers the caller gets back (rate-limit state, upstream processing time).
PASSED_HEADERS = frozenset({"openai-processing-ms", "retry-after", "retry-after-ms"})


class Truncated(Exception):
    """A stream ended cleanly at the transport level but without a finish reason."""


@dataclass(frozen=True)
class Answer:
    """A non-streamed upstream answer as the gateway reads it; ``body`` is the whole answer."""

    body: dict[str, Any]
    text: str
    finish_reason: str | None
    usage: Usage
    tool_calls: int
    headers: dict[str, str]


@dataclass(frozen=True)
class StreamedAnswer:
    """A stream's answer: its quality judged at its end; its assembled body (None for APIs other
    than chat) and its text computed when first read, by whoever reads them (the server forwards
    the chunks and reads neither unless it stores answers)."""

    body: Deferred[dict[str, Any] | None]
    text: Deferred[str]
    finish_reason: str | None
    usage: Usage
    tool_calls: int
    headers: dict[str, str]
    quality: AnswerQuality


def _int(v: object) -> int:
    """A token count from an upstream: a finite non-negative number, else 0 (never raises)."""
    if type(v) is int:
        return v if v > 0 else 0
    if type(v) is float and math.isfinite(v):
        return int(v) if v > 0 else 0
    return 0


def usage_of(u: object) -> Usage:
    """Usage from a chat/completions/embeddings ``usage`` object or a Responses API one."""
    if not isinstance(u, Mapping):
        return Usage()
    if "input_tokens" in u or "output_tokens" in u:  # the Responses API's names
        details, out_details = u.get("input_tokens_details"), u.get("output_tokens_details")
        return Usage(
            prompt_tokens=_int(u.get("input_tokens")),
            cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0,
            completion_tokens=_int(u.get("output_tokens")),
            reasoning_tokens=_int(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else 0,
        )
    details, out_details = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    return Usage(
        prompt_tokens=_int(u.get("prompt_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0,
        completion_tokens=_int(u.get("completion_tokens")),
        reasoning_tokens=_int(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else 0,
    )


def _kind(value: object) -> str:
    if isinstance(value, str):
        return f"text, not a JSON object: {value[:80]!r}"
    return f"JSON {type(value).__name__}, not a completion object"


def decode_json(content: bytes) -> object:
    """An upstream body as JSON, or :class:`BadResponse` (HTML, bad JSON, not UTF-8)."""
    try:
        return fastjson.loads(content)
    except (ValueError, RecursionError):
        text = content[:200].decode("utf-8", "replace")
        raise BadResponse(f"malformed response from upstream: {_kind(text)}") from None


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The upstream response headers a caller gets back."""
    return {
        k.lower(): v for k, v in headers.items() if k.lower() in PASSED_HEADERS or k.lower().startswith("x-ratelimit-")
    }


def _chat_answer(body: dict) -> tuple[str, str | None, int]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BadResponse(f"malformed response from upstream: choices is {choices!r:.80}, expected at least one")
    first = choices[0]
    message = first.get("message") if isinstance(first, Mapping) else None
    if not isinstance(message, Mapping):
        raise BadResponse("malformed response from upstream: the first choice has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise BadResponse(f"malformed response from upstream: message content is {type(content).__name__}")
    calls = message.get("tool_calls")
    n_calls = len(calls) if isinstance(calls, list) else 0
    finish = first.get("finish_reason")
    return content or "", finish if isinstance(finish, str) else None, n_calls


def _completions_answer(body: dict) -> tuple[str, str | None, int]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BadResponse(f"malformed response from upstream: choices is {choices!r:.80}, expected at least one")
    text = choices[0].get("text")
    if not isinstance(text, str):
        raise BadResponse("malformed response from upstream: the first choice has no text")
    finish = choices[0].get("finish_reason")
    return text, finish if isinstance(finish, str) else None, 0


def _embeddings_answer(body: dict) -> tuple[str, str | None, int]:
    data = body.get("data")
    if not isinstance(data, list) or not data or not all(isinstance(d, Mapping) and "embedding" in d for d in data):
        raise BadResponse("malformed response from upstream: no embeddings in data")
    return "", None, 0


def response_output(response: Mapping) -> tuple[str, int]:
    """(output text, function calls) of a Responses API ``response`` object."""
    output = response.get("output")
    if not isinstance(output, list):
        raise BadResponse("malformed response from upstream: the response has no output list")
    texts: list[str] = []
    calls = 0
    for item in output:
        if not isinstance(item, Mapping):
            continue
        if item.get("type") == "function_call":
            calls += 1
        elif item.get("type") == "message" and isinstance(item.get("content"), list):
            texts.extend(
                p["text"]
                for p in item["content"]
                if isinstance(p, Mapping) and p.get("type") == "output_text" and isinstance(p.get("text"), str)
            )
    return "".join(texts), calls


def refused(response: Mapping) -> bool:
    """Whether a Responses API ``response`` holds a refusal (a message's ``refusal`` content part)."""
    output = response.get("output")
    return isinstance(output, list) and any(
        isinstance(item, Mapping)
        and item.get("type") == "message"
        and isinstance(item.get("content"), list)
        and any(isinstance(p, Mapping) and p.get("type") == "refusal" for p in item["content"])
        for item in output
    )


def responses_finish(response: Mapping) -> str | None:
    """The finish the log keeps for a Responses API answer: ``refusal`` when the model refused
    (the status then still says ``completed``), else its status."""
    if refused(response):
        return "refusal"
    status = response.get("status")
    return status if isinstance(status, str) else None


def _responses_answer(body: dict) -> tuple[str, str | None, int]:
    if body.get("object") not in (None, "response"):
        raise BadResponse(f"malformed response from upstream: object is {body.get('object')!r:.40}")
    text, calls = response_output(body)
    return text, responses_finish(body), calls


_READERS: dict[str, Callable[[dict], tuple[str, str | None, int]]] = {
    "chat": _chat_answer,
    "completions": _completions_answer,
    "embeddings": _embeddings_answer,
    "responses": _responses_answer,
}


def read_answer(api: str, content: bytes, headers: Mapping[str, str], model: str) -> Answer:
    """A non-streamed answer of ``api`` from its bytes, ``model`` set to the routed model;
    :class:`BadResponse` when the 200 is not such an answer."""
    body = decode_json(content)
    if not isinstance(body, dict):
        raise BadResponse(f"malformed response from upstream: {_kind(body)}")
    text, finish, calls = _READERS[api](body)
    if "model" in body or api != "embeddings":
        body["model"] = model
    return Answer(body, text, finish, usage_of(body.get("usage")), calls, passed_headers(headers))


class StreamAccount:
    """What one streamed attempt has delivered so far, read chunk by chunk the same way by both
    drivers: first-output times, usage, finish reason, tool calls and the text of choice 0.

    Chunks before the first output (the role chunk, ``response.created``) are held back and
    released with it, so an attempt that fails before any output leaves nothing at the caller and
    the next route can still answer; after it, every chunk is released as it comes, in order,
    unmerged. Each released chunk has ``model`` set to the routed model."""

    __slots__ = (
        "_model_json",
        "api",
        "attempt_ttft_ms",
        "calls",
        "clock",
        "finish",
        "first_out",
        "head",
        "last_out",
        "model",
        "outputs",
        "pending",
        "pieces",
        "refused",
        "released",
        "response_id",
        "started",
        "t0",
        "tool_parts",
        "ttft_ms",
        "usage",
    )

    def __init__(self, api: str, model: str, started: float, t0: float, clock: Callable[[], float]):
        self.api = api
        self.model = model
        self.started = started  # when the caller's request started (TTFT is what the caller waited)
        self.t0 = t0  # when this attempt started
        self.clock = clock
        # Text of choice 0 (chat, completions) or output text (responses), joined when read.
        self.pieces: list[str] = []
        self._model_json = fastjson.dumps(model)
        self.pending: list[dict] = []
        self.released = 0
        self.ttft_ms: float | None = None
        self.attempt_ttft_ms: float | None = None
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.calls: set[tuple[int, int]] | int = set() if api != "responses" else 0
        self.response_id: str | None = None
        self.head: dict[str, Any] = {}  # id, created, system_fingerprint, ... of the first chunk
        self.tool_parts: dict[int, dict[str, Any]] = {}  # choice 0's tool calls, assembled
        self.refused = False  # a refusal delta was seen
        self.outputs = 0  # chunks that carried output, and when the first and the last came
        self.first_out = 0.0
        self.last_out = 0.0

    def take(self, chunk: object, deadline: AttemptDeadline) -> list[dict]:
        """The chunks to hand on now (none while waiting for the first output);
        :class:`BadResponse` when the chunk is not a chunk of this API."""
        if not isinstance(chunk, dict):
            raise BadResponse(f"malformed stream chunk from upstream: {_kind(chunk)}")
        output = self._responses_event(chunk) if self.api == "responses" else self._chunk(chunk)
        if output:
            self.last_out = self.clock()
            self.outputs += 1
            if self.outputs == 1:
                self.first_out = self.last_out
        if output and self.ttft_ms is None:
            now = self.last_out
            deadline.first_token()
            self.ttft_ms = (now - self.started) * 1000.0
            self.attempt_ttft_ms = (now - self.t0) * 1000.0
        if self.ttft_ms is None:
            self.pending.append(chunk)
            return []
        if self.pending:
            out, self.pending = [*self.pending, chunk], []
        else:
            out = [chunk]
        self.released += len(out)
        return out

    def pass_raw(self, data: bytes) -> bytes | None:
        """A chat or completions chunk that accounting does not need to read, as the bytes to hand
        on (``model`` rewritten to the routed model where the upstream names another); None when
        the chunk must be parsed and taken with :meth:`take`.

        Only a chunk after the first output can pass, and only one that provably carries nothing
        the accounting reads: read by orjson (one UTF-8 JSON object; anything else goes the slow
        way, where the standard parser says what is wrong), it has no top-level ``error`` and a
        null ``usage``, and every choice a null ``finish_reason`` and (chat) a delta whose
        ``tool_calls``, ``function_call``, ``audio`` and ``refusal`` are null or absent: what
        :meth:`take` reads, read the same way, so the slow path would learn nothing more from it.
        A ``\\u`` escape anywhere sends it the slow way too: the handler finds ``usage`` in the
        bytes it hands on. Its text is read as :meth:`take` reads it, and a chunk that is not a
        chunk of this API fails the stream before it is handed on, as a parsed one does. Its bytes
        stay as they are when its top-level ``model`` is the routed one (or it has none)."""
        if self.ttft_ms is None or self.pending or self.api == "responses" or b"\\u" in data:
            return None
        try:
            chunk = orjson.loads(data)  # UTF-8 and JSON, or the parser of the slow path says what is wrong
        except orjson.JSONDecodeError:
            return None
        if type(chunk) is not dict or "error" in chunk or chunk.get("usage") is not None:
            return None
        choices = chunk.get("choices")
        if type(choices) is not list:
            raise BadResponse(f"malformed stream chunk from upstream: choices is {choices!r:.80}")
        chat = self.api == "chat"
        text = ""
        output = False
        for choice in choices:
            if type(choice) is not dict:
                raise BadResponse(f"malformed stream chunk from upstream: choices is {choices!r:.80}")
            if choice.get("finish_reason") is not None:
                return None
            if chat:
                delta = choice.get("delta")
                if delta is None:
                    continue
                if type(delta) is not dict:
                    raise BadResponse(f"malformed stream chunk from upstream: delta is {delta!r:.80}")
                if (
                    delta.get("tool_calls") is not None
                    or delta.get("refusal") is not None
                    or delta.get("audio") is not None
                    or delta.get("function_call") is not None
                ):
                    return None
                piece = delta.get("content")
            else:
                piece = choice.get("text")
            if type(piece) is str:
                if piece:
                    output = True
                    if choice.get("index", 0) == 0:
                        text += piece
            elif piece is not None:
                raise BadResponse(f"malformed stream chunk from upstream: content is {type(piece).__name__}")
        if chunk.get("model", self.model) != self.model:  # the routed name is the upstream's: as they are
            rewritten = self._rewrite_model(data)
            if rewritten is None:
                return None
            data = rewritten
        if text:
            self.pieces.append(text)
        self.released += 1
        if output:  # an output chunk, for the time between chunks
            self.last_out = self.clock()
            self.outputs += 1
        return data

    def _rewrite_model(self, data: bytes) -> bytes | None:
        """``data`` with its one top-level ``"model":"..."`` naming the routed model (None: not that
        plain shape, parse it)."""
        if data.count(b'"model"') != 1 or b'\\"model"' in data:
            return None
        at = data.find(b'"model":"')
        if at < 0 or data.find(b"{", 1, at) >= 0 or data.find(b"[", 1, at) >= 0:
            return None  # not at the top level before any nested value: the parser decides
        start = at + 8
        end = data.find(b'"', start + 1)
        if end < 0 or b"\\" in data[start:end]:
            return None
        if data[start : end + 1] == self._model_json:
            return data
        return data[:start] + self._model_json + data[end + 1 :]

    def text(self) -> str:
        """The text so far (choice 0, or the Responses output text)."""
        if len(self.pieces) != 1:
            self.pieces[:] = ["".join(self.pieces)] if self.pieces else []
        return self.pieces[0] if self.pieces else ""

    def _chunk(self, chunk: dict) -> bool:
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise BadResponse(f"malformed stream chunk from upstream: choices is {choices!r:.80}")
        if "model" in chunk:
            chunk["model"] = self.model
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "system_fingerprint", "service_tier") if k in chunk}
        u = chunk.get("usage")
        if u is not None:
            self.usage = usage_of(u)
        output = False
        assert isinstance(self.calls, set)
        for choice in choices:
            index = choice.get("index", 0)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                output = True
                if index == 0 or self.finish is None:
                    self.finish = finish
            if self.api == "completions":
                text = choice.get("text")
            else:
                delta = choice.get("delta")
                if delta is None:
                    continue
                if not isinstance(delta, dict):
                    raise BadResponse(f"malformed stream chunk from upstream: delta is {delta!r:.80}")
                text = delta.get("content")
                calls = delta.get("tool_calls")
                if isinstance(calls, list) and calls:
                    output = True
                    for c in calls:
                        if isinstance(c, Mapping):
                            self.calls.add((index if isinstance(index, int) else 0, _int(c.get("index"))))
                            if index == 0:
                                self._assemble_call(c)
                if delta.get("refusal") or delta.get("audio") or delta.get("function_call"):
                    output = True
                    self.refused = self.refused or bool(delta.get("refusal"))
            if isinstance(text, str) and text:
                output = True
                if index == 0:
                    self.pieces.append(text)
            elif text is not None and not isinstance(text, str):
                raise BadResponse(f"malformed stream chunk from upstream: content is {type(text).__name__}")
        return output

    def _responses_event(self, event: dict) -> bool:
        kind = event.get("type")
        if not isinstance(kind, str):
            raise BadResponse("malformed stream event from upstream: no type")
        response = event.get("response")
        if isinstance(response, dict):
            if "model" in response:
                response["model"] = self.model
            if isinstance(response.get("id"), str):
                self.response_id = response["id"]
        if kind == "error" or kind == "response.failed":
            err = event.get("error") if kind == "error" else (response or {}).get("error")
            message = err.get("message") if isinstance(err, Mapping) else event.get("message")
            raise BadResponse(f"the upstream's stream reported a failure: {message or kind}")
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self.pieces.append(delta)
            return True
        if kind in ("response.completed", "response.incomplete"):
            assert isinstance(response, dict) or response is None
            if isinstance(response, dict):
                self.usage = usage_of(response.get("usage"))
                self.finish = responses_finish(response) or kind.rsplit(".", 1)[1]
                try:
                    _, calls = response_output(response)
                except BadResponse:
                    calls = 0
                self.calls = calls
            else:
                self.finish = kind.rsplit(".", 1)[1]
            return True
        return kind.endswith(".delta") or kind == "response.output_item.added"

    def _assemble_call(self, delta: Mapping) -> None:
        part = self.tool_parts.setdefault(
            _int(delta.get("index")), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if isinstance(delta.get("id"), str):
            part["id"] = delta["id"]
        fn = delta.get("function")
        if isinstance(fn, Mapping):
            for k in ("name", "arguments"):
                if isinstance(fn.get(k), str):
                    part["function"][k] += fn[k]

    @property
    def tool_calls(self) -> int:
        return len(self.calls) if isinstance(self.calls, set) else self.calls

    def assembled(self, *, with_text: bool = True) -> dict[str, Any] | None:
        """Choice 0 of a chat stream as one ``chat.completion`` body (text, tool calls, finish,
        usage), as the SDK's stream helpers assemble it; None for the other APIs. ``with_text``
        False leaves ``content`` None without reading the text: the quality checks read no content
        unless the request asked for a response schema."""
        if self.api != "chat":
            return None
        content = (self.text() or None) if with_text else None
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if self.tool_parts:
            message["tool_calls"] = [self.tool_parts[i] for i in sorted(self.tool_parts)]
        u = self.usage or Usage()
        return {
            "id": self.head.get("id", ""),
            "object": "chat.completion",
            "created": self.head.get("created", 0),
            "model": self.model,
            **{k: self.head[k] for k in ("system_fingerprint", "service_tier") if k in self.head},
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish}],
            "usage": {
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "total_tokens": u.total_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            },
        }

    def check_finished(self) -> list[dict]:
        """At the end of the stream: what is still held back (an answer with no output at all),
        or :class:`Truncated` when it ended without a finish."""
        if self.finish is None:
            raise Truncated("the stream ended without a finish reason")
        out, self.pending = self.pending, []
        self.released += len(out)
        return out

    @property
    def chunk_gap_ms(self) -> float | None:
        """The mean time between output chunks (None below two)."""
        if self.outputs < 2:
            return None
        return (self.last_out - self.first_out) * 1000.0 / (self.outputs - 1)

    def record_kw(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "attempt_ttft_ms": self.attempt_ttft_ms, "usage": self.usage}


def choice0_text(api: str, choices: Iterable[Mapping]) -> str:
    """The text a chunk's choices add to choice 0 (``text`` for completions, ``delta.content`` for
    chat); :class:`BadResponse` when a delta is not an object or a text is not a string, however the
    chunk was read."""
    out = ""
    for choice in choices:
        if choice.get("index", 0) != 0:
            continue
        if api == "completions":
            text = choice.get("text")
        else:
            delta = choice.get("delta")
            if delta is None:
                continue
            if not isinstance(delta, Mapping):
                raise BadResponse(f"malformed stream chunk from upstream: delta is {type(delta).__name__}")
            text = delta.get("content")
        if isinstance(text, str):
            out += text
        elif text is not None:
            raise BadResponse(f"malformed stream chunk from upstream: content is {type(text).__name__}")
    return out


def chunk_text(api: str, chunk: Mapping) -> str:
    """The text a chunk adds to choice 0 (the library's plain-text view of a stream; its chunks
    passed the stream's accounting, so their shape is checked already)."""
    if api == "responses":
        return chunk["delta"] if chunk.get("type") == "response.output_text.delta" else ""
    return choice0_text(api, chunk.get("choices") or ())
