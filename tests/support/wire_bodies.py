"""OpenAI chat-completion bodies and SSE chunk streams built from plain values, for the tests'
handlers and upstreams (the gateway forwards the upstream's answers and builds none itself).

Streams follow OpenAI's framing: a first chunk carrying the assistant role, content chunks, a chunk
with the ``finish_reason``, then, with ``stream_options.include_usage``, one chunk with empty
``choices`` and the ``usage`` (every earlier chunk carries ``"usage": null``), then ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from app.server.wire import SSE_DONE, dumps

_dumps = dumps


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }


def completion_body(
    *,
    completion_id: str,
    created: int,
    model: str,
    content: str,
    finish_reason: str = "stop",
    usage: dict | None = None,
) -> dict:
    """A non-streamed ``chat.completion`` body."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
        "system_fingerprint": None,
    }


def completion_json(**kwargs: Any) -> bytes:
    return _dumps(completion_body(**kwargs))


class ChunkStream:
    """Encodes one streamed response as SSE ``chat.completion.chunk`` events.

    Call :meth:`role` once, :meth:`content` per piece, :meth:`finish`, then :meth:`usage` (an empty
    string unless the client asked for it) and :meth:`done`.
    """

    def __init__(self, *, completion_id: str, created: int, model: str, include_usage: bool):
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self.include_usage = include_usage
        # Every chunk shares this head; building it once keeps a 200-chunk stream cheap.
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self._head = _dumps(head)[:-1] + b","
        self._tail = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    def _chunk(self, delta: dict, finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return b"data: " + self._head + b'"system_fingerprint":null,"choices":[' + _dumps(choice) + b"]" + self._tail

    def role(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def content(self, text: str) -> bytes:
        return self._chunk({"content": text}, None)

    def finish(self, finish_reason: str = "stop") -> bytes:
        return self._chunk({}, finish_reason)

    def usage(self, usage: dict) -> bytes:
        if not self.include_usage:
            return b""
        return b"data: " + self._head + b'"system_fingerprint":null,"choices":[],"usage":' + _dumps(usage) + b"}\n\n"

    @staticmethod
    def done() -> bytes:
        return SSE_DONE


def sse_events(
    pieces: Iterable[str],
    *,
    completion_id: str,
    created: int,
    model: str,
    include_usage: bool,
    usage: dict | None = None,
    finish_reason: str = "stop",
) -> Iterator[bytes]:
    """A whole stream from text pieces, usage known up front."""
    enc = ChunkStream(completion_id=completion_id, created=created, model=model, include_usage=include_usage)
    yield enc.role()
    for piece in pieces:
        yield enc.content(piece)
    yield enc.finish(finish_reason)
    if usage is not None and include_usage:
        yield enc.usage(usage)
    yield enc.done()
