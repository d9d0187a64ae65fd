"""The async driver's HTTP client for real (``http(s)://``) upstreams, without the SDK: pyreqwest
(Rust's reqwest on hyper), one client per provider.

hyper owns the wire: message framing, ``1xx`` interim answers read past, bytes after a response's
end closing the connection instead of reaching the next caller, head-size limits, keep-alive. What
is ours stays small and strict:

- redirects are never followed, cookies never kept, and the proxy and TLS trust are the ones
  :mod:`app.netconf` resolved for the provider (no hidden reading of the environment);
- bodies are decoded here (``gzip`` with every member, ``deflate`` zlib-wrapped or raw, stacked
  codings), piece by piece, and the response-size limit counts decoded bytes at every step, so a
  compressed bomb never grows past the limit in memory; a coding the gateway did not ask for is
  refused by name;
- failures are the httpx2 exceptions the router classifies (``ConnectError``/``ConnectTimeout``
  before an answer, ``ReadTimeout``, ``RemoteProtocolError`` for a malformed or cut answer,
  ``ReadError``), and one through a proxy names the proxy;
- a status >= 300 raises the SDK's own ``APIStatusError`` subclass built from the same response;
- a stream is split into SSE events here and read as the SDK reads it: ``[DONE]`` ends it, an
  event whose data has an ``error`` raises ``openai.APIError``; after ``[DONE]`` the rest of the
  body is read in the background so the connection goes back to the pool.

Cancelling a request (the caller went away, a deadline) once its answer has begun drops its
connection at once. Before the answer's head, the request is abandoned: it ends when its head
arrives or at its timeout, which every request carries.

pyreqwest's awaitables finish with their result when it is ready at the moment a cancellation is
thrown into them (measured: 178 of 200 cancels that landed as a chunk arrived were lost), and one
thrown into a request as its head arrives leaks the answer and its connection. So the opening of a
request is never cancelled inside pyreqwest, and every read checks the task's cancel count and
raises the cancellation itself (:func:`_cancel_requested`).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import weakref
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import httpx2
import openai
from pyreqwest import exceptions as rq
from pyreqwest.client import Client, ClientBuilder
from pyreqwest.proxy import ProxyBuilder
from pyreqwest.response import Response

from app.netconf import NetConf
from app.routing.errors import BadResponse
from app.routing.io.body_limit import Budget
from app.routing.sse import SSEEvent, SSESplitter
from core import fastjson

__all__ = ["KEEPALIVE_S", "HttpUpstream", "TransportUpstream", "UpstreamAnswer", "UpstreamStream"]

# Idle pooled connections are dropped after this: below the 5 s idle limit of uvicorn, vLLM and
# Node's http server, so a request never races the server's close of an idle connection.
KEEPALIVE_S = 4.0
BACKSTOP_S = 1.0  # how long after the attempt's own deadline the client's timeout ends a request
DRAIN_S = 1.0  # after [DONE], how long the end of the body may take for the connection to be reused
DRAIN_BYTES = 64 * 1024
PIECE = 64 * 1024  # the largest piece a decoder hands on at once
ACCEPT_ENCODING = "gzip, deflate"

log = logging.getLogger(__name__)
_live: weakref.WeakSet[HttpUpstream] = weakref.WeakSet()


class UpstreamAnswer:
    """A non-streamed 2xx answer: what the router reads of ``httpx2.Response``."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes):
        self.status_code = status_code
        self.headers = headers
        self.content = content


# -- bodies ------------------------------------------------------------------------------------
class _Inflater:
    """One content coding undone, piece by piece (each at most :data:`PIECE` bytes)."""

    def __init__(self, coding: str):
        self.coding = coding
        self._d: Any = zlib.decompressobj(31) if coding == "gzip" else None

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._d is None:  # deflate: zlib-wrapped as the RFC says, or raw as some servers send it
            if not data:
                return
            zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._d = zlib.decompressobj(15 if zlib_header else -15)
        while data:
            try:
                out = self._d.decompress(data, PIECE)
            except zlib.error as exc:
                raise BadResponse(f"upstream body is not valid {self.coding}: {exc}") from None
            data = self._d.unconsumed_tail
            if out:
                yield out
            if self._d.eof:
                rest = self._d.unused_data
                if self.coding == "gzip" and rest.strip(b"\0"):
                    self._d = zlib.decompressobj(31)  # another gzip member (RFC 1952 allows many)
                    data = rest
                elif rest.strip(b"\0"):
                    raise BadResponse(f"upstream body has {len(rest)} bytes after its {self.coding} data")

    def end(self) -> None:
        if self._d is not None and not self._d.eof:
            raise BadResponse(f"upstream {self.coding} body ended before its end marker")


def _cancel_requested(task: asyncio.Task | None, asked: int) -> bool:
    """Whether ``task`` was asked to cancel since its cancel count was ``asked``: true after a
    pyreqwest await that returned though a cancellation was thrown into it."""
    return task is not None and task.cancelling() > asked


class _Body:
    """A response body, decoded, counted against the limit on decoded bytes."""

    def __init__(self, response: Response, limit: int):
        self.response = response
        self.budget = Budget(limit)
        codings = [c.strip().lower() for c in ",".join(response.headers.getall("content-encoding")).split(",")]
        codings = [c for c in codings if c and c != "identity"]
        unknown = [c for c in codings if c not in ("gzip", "x-gzip", "deflate")]
        if unknown:
            raise BadResponse(
                f"upstream answered with Content-Encoding {', '.join(unknown)}, which the gateway did not ask for "
                f"(it sends Accept-Encoding: {ACCEPT_ENCODING})"
            )
        # Applied in the order listed, so undone from the last.
        self.stages = [_Inflater("gzip" if c == "x-gzip" else c) for c in reversed(codings)]

    async def pieces(self) -> AsyncIterator[bytes]:
        read_chunk = self.response.body_reader.read_chunk
        while True:
            task = asyncio.current_task()
            asked = task.cancelling() if task is not None else 0
            chunk = await read_chunk()
            if _cancel_requested(task, asked):
                raise asyncio.CancelledError
            if chunk is None:
                break
            for piece in self.decoded(chunk.to_bytes()):
                yield piece
        self.end()

    def decoded(self, data: bytes) -> Iterator[bytes]:
        """What one read of the body decodes to, counted against the limit."""
        if not self.stages:
            yield self.budget.count(data)
            return
        for piece in self._decode(data, 0):
            yield self.budget.count(piece)

    def end(self) -> None:
        for stage in self.stages:
            stage.end()

    def _decode(self, data: bytes, i: int) -> Iterator[bytes]:
        if i == len(self.stages):
            if data:
                yield data
            return
        for piece in self.stages[i].feed(data):
            yield from self._decode(piece, i + 1)

    async def read(self) -> bytes:
        parts = [piece async for piece in self.pieces()]
        return b"".join(parts)


# -- streams -----------------------------------------------------------------------------------
class UpstreamStream:
    """A streamed 2xx answer: ``async with``, then ``async for`` the events' JSON objects, as the
    SDK's ``AsyncStream[object]``; ``.response.headers`` for the upstream's headers."""

    def __init__(self, upstream: HttpUpstream, call: _Call, url: str):
        self._upstream = upstream
        self._call = call
        self._url = url
        self.response = self  # the SDK stream's ``.response.headers``
        self.headers: Mapping[str, str] = call.headers
        self.done = False

    async def __aenter__(self) -> UpstreamStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self.done:
            self._upstream._drain(self._call)  # the end of the body read in the background
        else:
            await self._call.close()  # not read to its end: the connection is dropped

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def reads(self) -> AsyncIterator[list[SSEEvent]]:
        """The stream's SSE events, undecoded, up to ``[DONE]``: the events each read of the body
        completed (a read may complete none). After the read that held ``[DONE]``, ``done`` is set
        and nothing more is read."""
        splitter = SSESplitter()
        body = self._call.body
        read_chunk = body.response.body_reader.read_chunk
        plain, count, feed = not body.stages, body.budget.count, splitter.feed
        current_task = asyncio.current_task
        try:
            while True:
                task = current_task()
                asked = task.cancelling() if task is not None else 0
                chunk = await read_chunk()
                if task is not None and task.cancelling() > asked:  # _cancel_requested, inline: once per chunk
                    raise asyncio.CancelledError
                if chunk is None:
                    break
                data = chunk.to_bytes()
                if plain:  # the common body: no content coding, one piece a read
                    events = feed(count(data))
                    if len(events) == 1 and events[0].data[:6] != b"[DONE]":
                        yield events
                        continue
                    pieces: Iterable[list[SSEEvent]] = (events,)
                else:
                    pieces = (feed(piece) for piece in body.decoded(data))
                for events in pieces:
                    for i, sse in enumerate(events):
                        if sse.data.startswith(b"[DONE]"):
                            self.done = True
                            yield events[:i]
                            return
                    yield events
            body.end()
            splitter.end()  # an event left without its closing blank line is not one
        except BaseException as exc:  # noqa: BLE001 - mapped and re-raised, never swallowed
            raise _mapped(exc, self._upstream.net) from None

    async def raw_events(self) -> AsyncIterator[SSEEvent]:
        """The stream's SSE events, undecoded, up to ``[DONE]``."""
        async for events in self.reads():
            for sse in events:
                yield sse

    def decode(self, sse: SSEEvent) -> Any:
        """One event's JSON, as the SDK's stream gives it (``openai.APIError`` for an error event)."""
        data = fastjson.loads(sse.data)
        if sse.event and sse.event.startswith("thread."):
            if sse.event == "error" and isinstance(data, Mapping) and data.get("error"):
                raise _stream_error(data, self._url)
            return {"data": data, "event": sse.event}
        if isinstance(data, Mapping) and data.get("error"):
            raise _stream_error(data, self._url)
        return data

    async def _events(self) -> AsyncIterator[Any]:
        async for sse in self.raw_events():
            yield self.decode(sse)


def _stream_error(data: Mapping[str, Any], url: str) -> openai.APIError:
    error = data.get("error")
    message = error.get("message") if isinstance(error, Mapping) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=httpx2.Request("POST", url), body=data["error"])


# -- errors ------------------------------------------------------------------------------------
def _causes(exc: BaseException) -> list[str]:
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, Mapping) else None
    return [str(c.get("message", "")) for c in causes or () if isinstance(c, Mapping)]


def _mapped(exc: BaseException, net: NetConf) -> BaseException:
    """A pyreqwest failure as the httpx2 exception the router classifies; anything else as is."""
    if not isinstance(exc, rq.PyreqwestError):
        return exc
    causes = _causes(exc)
    # The innermost causes say what happened ("Connection refused", "message head is too large").
    detail = "; ".join(c for c in causes[-2:] if c) or (str(exc.args[0]) if exc.args else type(exc).__name__)
    if isinstance(exc, rq.ConnectTimeoutError) and any("connect" in c.lower() for c in causes):
        # pyreqwest also calls the request's own timeout, passed before the answer's head, a connect
        # timeout; only a cause from the connector means no connection was made.
        via = f" via {net.describe_proxy()}" if net.proxy else ""
        return httpx2.ConnectTimeout(f"no connection in time{via}: {detail}")
    if isinstance(exc, rq.RequestTimeoutError):
        return httpx2.ReadTimeout(f"no answer in time: {detail}")
    if isinstance(exc, rq.ConnectError):
        if net.proxy:
            return httpx2.ConnectError(f"could not reach the upstream through {net.describe_proxy()}: {detail}")
        return httpx2.ConnectError(f"could not connect: {detail}")
    if isinstance(exc, rq.WriteError):
        return httpx2.WriteError(detail)
    if isinstance(exc, rq.ReadError):
        return httpx2.ReadError(detail)
    return httpx2.RemoteProtocolError(f"malformed answer from upstream: {detail}")


# -- calls -------------------------------------------------------------------------------------
class _Call:
    """One request in flight: the streamed request's context, its response and decoded body."""

    __slots__ = ("body", "context", "headers", "raw_headers", "response")

    def __init__(self, context: Any, response: Response, limit: int):
        self.context = context
        self.response = response
        self.raw_headers = [(k.lower(), v) for k, v in response.headers.items()]
        self.headers = httpx2.Headers(self.raw_headers)
        self.body = _Body(response, limit)

    async def close(self) -> None:
        """End the request: a body read to its end leaves the connection in the pool, any other is
        dropped with its connection."""
        context, self.context = self.context, None
        if context is not None:
            await context.__aexit__(None, None, None)


class HttpUpstream:
    """One provider's upstream: ``await post(path, body, headers, timeout_s, stream)``.

    ``default_headers`` are the SDK client's own (key, user agent, platform), so the upstream sees
    the same request; ``sdk`` builds the status errors. The number of requests at once is bounded
    by the server's :class:`~app.routing.io.pool.ProviderPool` slots, taken before each call."""

    def __init__(
        self,
        base_url: str,
        *,
        sdk: openai.AsyncOpenAI,
        max_response_bytes: int,
        net: NetConf | None = None,
        connect_timeout_s: float = 30.0,
        max_idle: int = 1024,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_response_bytes = max_response_bytes
        self.net = net or NetConf()
        self._sdk = sdk
        headers = {k: v for k, v in sdk.default_headers.items() if isinstance(v, str)}
        headers["Content-Type"] = "application/json"
        headers["Accept-Encoding"] = ACCEPT_ENCODING
        headers["Authorization"] = f"Bearer {sdk.api_key}"  # the SDK adds it per request (bearer_auth)
        self._headers = headers
        self._drains: set[asyncio.Task] = set()
        self._client: Any = self._build(connect_timeout_s, max_idle)

    def _build(self, connect_timeout_s: float, max_idle: int) -> Any:  # a pyreqwest Client here
        _live.add(self)
        b = (
            ClientBuilder()
            .follow_redirects(False)
            .referer(False)
            .gzip(False)  # decoded here, against the limit
            .brotli(False)
            .zstd(False)
            .deflate(False)
            .http1_only()
            .tcp_nodelay(True)
            .no_proxy()  # the environment was read by netconf; its answer is set below
            .connect_timeout(timedelta(seconds=connect_timeout_s))
            .pool_idle_timeout(timedelta(seconds=KEEPALIVE_S))
            .pool_max_idle_per_host(max_idle)
            .default_headers(self._headers)
        )
        if self.net.proxy:
            b = b.proxy(ProxyBuilder.all(self.net.proxy))
        ca = self.net.ca_pem()
        if ca:
            b = b.add_root_certificate_pem(ca)
        cert, key = self.net.identity_pem(), self.net.key_pem()
        if cert:
            b = b.identity_pem(key + b"\n" + cert if key and key != cert else cert)
        return b.build()

    async def _open(self, url: str, content: bytes, headers: Mapping[str, str] | None, timeout_s: float, stream: bool):
        """The request sent and its answer's head read: ``(context, response)``, the context's
        ``__aexit__`` ending the request."""
        builder = self._client.post(url).body_bytes(content)
        if headers:
            builder = builder.headers(dict(headers))
        # Every request carries its attempt's timeout: the bound of one that was cancelled before
        # its answer's head (see the module's docstring). A stream's reads are timed by the driver;
        # the backstop fires a little after the driver's own deadline, which names what passed.
        builder = builder.timeout(timedelta(seconds=timeout_s + BACKSTOP_S))
        if stream:
            builder = builder.streamed_read_buffer_limit(0)  # each chunk handed on as it comes
        context = builder.build_streamed()
        # Never cancelled inside pyreqwest: a cancellation thrown into it as the answer's head
        # arrives leaks that answer and its connection (measured: open 8 s later, with the
        # request's timeout at 30 s). A caller that leaves instead abandons the opening, which ends
        # the request as soon as its head arrives, or at its timeout.
        opening = asyncio.ensure_future(context.__aenter__())
        try:
            return context, await asyncio.shield(opening)
        except asyncio.CancelledError:
            if opening.done():
                self._end_abandoned(context, opening)
            else:
                opening.add_done_callback(lambda _: self._end_abandoned(context, opening))
            raise

    def _end_abandoned(self, context: Any, opening: asyncio.Future) -> None:
        """End a request whose caller left before its answer's head: its connection is dropped."""
        if opening.cancelled() or opening.exception() is not None:
            return  # nothing was opened (the exception is retrieved: it concerns no one now)
        task = asyncio.ensure_future(context.__aexit__(None, None, None))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def aclose(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await self._client.close()
        _live.discard(self)

    def _drain(self, call: _Call) -> None:
        """Read what is left of a finished stream's body (its last chunk, usually already here) and
        end it, so its connection goes back to the pool; at most :data:`DRAIN_S`."""

        async def drain() -> None:
            try:
                async with asyncio.timeout(DRAIN_S):
                    seen = 0
                    task, reader = asyncio.current_task(), call.response.body_reader
                    while seen <= DRAIN_BYTES:
                        asked = task.cancelling() if task is not None else 0
                        chunk = await reader.read_chunk()
                        if _cancel_requested(task, asked):  # the timeout's, or the client's close
                            raise asyncio.CancelledError
                        if chunk is None:
                            break
                        seen += len(chunk)
            except (Exception, asyncio.CancelledError):  # noqa: BLE001 - the connection is dropped, nothing lost
                pass
            finally:
                await call.close()

        task = asyncio.ensure_future(drain())
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def post(
        self,
        path: str,
        body: Mapping[str, Any] | bytes,
        *,
        headers: Mapping[str, str] | None,
        timeout_s: float,
        stream: bool,
    ) -> UpstreamAnswer | UpstreamStream:
        url = f"{self.base_url}/{path.lstrip('/')}"
        content = body if isinstance(body, bytes) else fastjson.dumps(body)
        call: _Call | None = None
        try:
            context, response = await self._open(url, content, headers, timeout_s, stream)
            try:
                call = _Call(context, response, self.max_response_bytes)
            except BaseException:  # a coding refused by name: the answer is dropped with its connection
                await context.__aexit__(None, None, None)
                raise
            if not call.body.stages:  # a declared length counts encoded bytes: only a plain body's is the size
                call.body.budget.refuse_declared(call.headers)
            if response.status >= 300:
                raise await self._status_error(call, url)
            if stream:
                return UpstreamStream(self, call, url)
            content = await call.body.read()
            answer = UpstreamAnswer(response.status, call.headers, content)
            await call.close()
            return answer
        except BaseException as exc:  # noqa: BLE001 - mapped and re-raised, never swallowed
            if call is not None:
                await asyncio.shield(call.close())
            raise _mapped(exc, self.net) from None

    async def _status_error(self, call: _Call, url: str) -> openai.APIStatusError:
        """The SDK's exception for this non-2xx response, built by the SDK from its bytes."""
        content = await call.body.read()
        rebuilt = httpx2.Response(
            call.response.status,
            headers=[(k, v) for k, v in call.raw_headers if k != "content-encoding"],
            content=content,
            request=httpx2.Request("POST", url),
        )
        return self._sdk._make_status_error_from_response(rebuilt)


# -- transports --------------------------------------------------------------------------------
class TransportUpstream(HttpUpstream):
    """One provider reached through an ``httpx2`` transport instead of the network: the built-in
    simulator, a test's mock. Only the bytes come from the transport: the request (headers, body,
    timeout), the size limit, the decoding, the stream's splitting into events and the failures
    are :class:`HttpUpstream`'s, so what the simulator answers is read as a real upstream's is."""

    def __init__(
        self, base_url: str, *, sdk: openai.AsyncOpenAI, transport: httpx2.AsyncBaseTransport, max_response_bytes: int
    ):
        self._transport = transport
        super().__init__(base_url, sdk=sdk, max_response_bytes=max_response_bytes)

    def _build(self, connect_timeout_s: float, max_idle: int) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=self._transport, follow_redirects=False, headers=self._headers)

    async def _open(self, url: str, content: bytes, headers: Mapping[str, str] | None, timeout_s: float, stream: bool):
        # The attempt's own timeout, no backstop: a transport holds no request the driver cannot cancel.
        request = self._client.build_request("POST", url, content=content, headers=headers, timeout=timeout_s)
        response = _TransportResponse(await self._client.send(request, stream=True))
        return response, response

    async def aclose(self) -> None:
        for task in list(self._drains):
            task.cancel()
        await self._client.aclose()


class _Piece(bytes):
    """A piece of a transport's body, as pyreqwest hands one on."""

    __slots__ = ()

    def to_bytes(self) -> bytes:
        return self


class _TransportHeaders:
    __slots__ = ("_headers",)

    def __init__(self, headers: httpx2.Headers):
        self._headers = headers

    def getall(self, name: str) -> list[str]:
        return self._headers.get_list(name)

    def items(self) -> list[tuple[str, str]]:
        return self._headers.multi_items()


async def _one(content: bytes) -> AsyncIterator[bytes]:
    yield content


class _TransportResponse:
    """A transport's streamed ``httpx2.Response`` with the surface of pyreqwest's that this module
    reads (``status``, ``headers``, ``body_reader.read_chunk()``), and its own request context:
    ``__aexit__`` closes it. The body is read raw: its codings are undone by :class:`_Body`."""

    __slots__ = ("_chunks", "_response", "body_reader", "headers", "status")

    def __init__(self, response: httpx2.Response):
        self._response = response
        self.status = response.status_code
        self.body_reader = self
        if response.is_stream_consumed:
            # Built with its body in hand (a mock's ``Response(content=...)``): httpx2 read and
            # decoded it then, so it is handed on as it is, with no coding left to undo.
            self._chunks = _one(response.content)
            headers = httpx2.Headers([(k, v) for k, v in response.headers.multi_items() if k != "content-encoding"])
        else:
            self._chunks = response.aiter_raw()
            headers = response.headers
        self.headers = _TransportHeaders(headers)

    async def read_chunk(self) -> _Piece | None:
        try:
            return _Piece(await self._chunks.__anext__())
        except StopAsyncIteration:
            return None

    async def __aexit__(self, *exc: object) -> None:
        await self._response.aclose()


@atexit.register
def _close_all() -> None:
    """Clients still alive when the interpreter ends are closed and let go of first: a pyreqwest
    client deallocated during the interpreter's finalization aborts the process."""
    for upstream in list(_live):
        try:
            asyncio.run(_closing(upstream._client))
        except Exception:  # closed or not, it is let go of below
            log.debug("closing an upstream client at exit failed", exc_info=True)
        upstream._client = None
    _live.clear()
    gc.collect()


async def _closing(client: Client) -> None:
    await client.close()
