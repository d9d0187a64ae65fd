"""A recording transport for real HTTP clients: every exchange a client makes through it is kept
(method, URL, status, headers and the exact body bytes it read), so a test can check what the server
*sent* beside what the SDK made of it, and validate each body and SSE event against the official
OpenAI schema.

    tap = WireTap()
    client = openai.OpenAI(base_url=..., api_key=..., http_client=tap.client())
    client.chat.completions.create(...)
    tap.validate_all()          # every JSON body / SSE chunk the client read, by endpoint
    tap.exchanges[-1].events    # the parsed SSE events (name, data) of a stream

The bytes are copied as the client reads them (the stream is not buffered ahead), so the client sees
the stream exactly as it arrives.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

from tests.support.openai_schema import SchemaError, validate

__all__ = ["Exchange", "WireTap", "parse_sse", "schema_for", "validate_exchange"]


@dataclass
class Exchange:
    method: str
    url: str
    path: str
    status: int
    headers: dict[str, str]  # lower-cased names
    sent: bytes = b""  # the request body the client sent
    body: bytearray = field(default_factory=bytearray)  # the response body the client read

    @property
    def sent_json(self) -> Any:
        return json.loads(self.sent) if self.sent else None

    @property
    def is_sse(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def events(self) -> list[tuple[str | None, Any]]:
        """The SSE events as ``(event name or None, data)``; data parsed as JSON except ``[DONE]``."""
        return parse_sse(bytes(self.body))


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    events: list[tuple[str | None, Any]] = []
    for block in raw.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].removeprefix(" "))
        if data:
            text = "\n".join(data)
            events.append((name, text if text == "[DONE]" else json.loads(text)))
    return events


def schema_for(path: str, status: int, *, streamed: bool) -> str:
    """The official schema a body at ``path`` must meet (an error body for any status >= 400)."""
    if status >= 400:
        return "ErrorResponse"
    p = path.rstrip("/")
    if p.endswith("/chat/completions"):
        return "CreateChatCompletionStreamResponse" if streamed else "CreateChatCompletionResponse"
    if p.endswith("/responses"):
        return "ResponseStreamEvent" if streamed else "Response"
    if p.endswith("/embeddings"):
        return "CreateEmbeddingResponse"
    if p.endswith("/completions"):
        return "CreateCompletionResponse"  # its stream chunks have the same shape
    if p.endswith("/models"):
        return "ListModelsResponse"
    if "/models/" in p:
        return "Model"
    raise KeyError(f"no schema known for {path}")


def validate_exchange(method: str, path: str, status: int, content_type: str, body: bytes) -> int:
    """Validate one answer body (JSON, or each event of an SSE stream) against the official schema
    for ``path``; returns how many objects were checked. Raises :class:`SchemaError` naming the
    exchange."""
    where = f"{method} {path} -> {status}"
    if not body:
        raise SchemaError(f"{where}: empty body")
    checked = 0
    try:
        if content_type.startswith("text/event-stream") and status < 400:
            name = schema_for(path, status, streamed=True)
            for event, data in parse_sse(body):
                if data == "[DONE]":
                    continue
                if event is not None and isinstance(data, dict) and event != data.get("type"):
                    raise SchemaError(f"event: {event!r} carries type {data.get('type')!r}")
                validate(name, data)
                checked += 1
        else:
            validate(schema_for(path, status, streamed=False), json.loads(body))
            checked += 1
    except (SchemaError, ValueError) as e:
        raise SchemaError(f"{where}: {e}") from e
    return checked


class _SyncTee(httpx2.SyncByteStream):
    def __init__(self, inner: Any, into: bytearray):
        self._inner, self._into = inner, into

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._into += chunk
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _AsyncTee(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, into: bytearray):
        self._inner, self._into = inner, into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._into += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Transport(httpx2.BaseTransport):
    def __init__(self, tap: WireTap):
        self._tap, self._inner = tap, httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._inner.handle_request(request)
        ex = self._tap._record(request, response)
        response.stream = _SyncTee(response.stream, ex.body)
        return response

    def close(self) -> None:
        self._inner.close()


class _AsyncTransport(httpx2.AsyncBaseTransport):
    def __init__(self, tap: WireTap):
        self._tap, self._inner = tap, httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        ex = self._tap._record(request, response)
        response.stream = _AsyncTee(response.stream, ex.body)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class WireTap:
    """Hands out httpx2 clients whose exchanges are recorded in :attr:`exchanges`, in order."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._clients: list[httpx2.Client] = []

    def _record(self, request: httpx2.Request, response: httpx2.Response) -> Exchange:
        headers = {k.lower(): v for k, v in response.headers.items()}
        try:
            sent = request.content
        except httpx2.RequestNotRead:
            sent = b""  # a streamed upload; the SDKs send JSON bodies as bytes
        ex = Exchange(request.method, str(request.url), request.url.path, response.status_code, headers, sent)
        with self._lock:
            self.exchanges.append(ex)
        return ex

    def client(self, **kw: Any) -> httpx2.Client:
        client = httpx2.Client(transport=_Transport(self), timeout=kw.pop("timeout", 30), **kw)
        self._clients.append(client)
        return client

    def close(self) -> None:
        """Close every sync client handed out (async ones are closed by their tests' event loops)."""
        for client in self._clients:
            client.close()
        self._clients.clear()

    def async_client(self, **kw: Any) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=_AsyncTransport(self), timeout=kw.pop("timeout", 30), **kw)

    @property
    def last(self) -> Exchange:
        return self.exchanges[-1]

    def validate_all(self) -> int:
        """Validate every body read so far against its official schema (each SSE event separately;
        a named event's ``event:`` must equal its ``type``); returns how many objects were checked."""
        return sum(
            validate_exchange(ex.method, ex.path, ex.status, ex.headers.get("content-type", ""), bytes(ex.body))
            for ex in self.exchanges
        )
