"""The async driver's HTTP client for real (``http(s)://``) upstreams: aiohttp, without the SDK.

Measured side by side in one process against nginx returning a fixed completion (2 cores shared;
``python -m benchmarks proxy`` explains the method), CPU per request of the client alone:

| client                                    | c=16     | c=64     | c=256    |
|-------------------------------------------|----------|----------|----------|
| openai SDK ``AsyncOpenAI.post`` on httpx2 | 2.37 ms  | 1.93 ms  | 3.45 ms  |
| httpx2 ``AsyncClient`` directly           | 1.38 ms  | 1.89 ms  | 1.99 ms  |
| httpx2, pool limits raised to c           | 1.33 ms  | 1.98 ms  | 3.32 ms  |
| aiohttp ``ClientSession`` (C parser)      | 0.19 ms  | 0.25 ms  | 0.28 ms  |

httpcore2's pool checks every idle connection's socket on each request
(``_assign_requests_to_connections``), so its cost grows with the pool; the SDK adds request
construction on top. aiohttp's connector hands out a connection in constant time and parses with
its C parser. The simulator and tests' injected transports keep the SDK on httpx2
(:mod:`app.routing.async_client`).

It is a drop-in for what the driver asked of the SDK, failure for failure, so classification,
deadlines and limits are exactly as before:

- a status >= 300 (redirects are never followed) raises the SDK's own ``APIStatusError`` subclass,
  built by the SDK from the same response (status, headers, body);
- a connection failure raises ``httpx2.ConnectError`` / ``ReadError`` / ``RemoteProtocolError``,
  a socket timeout ``httpx2.ConnectTimeout`` / ``ReadTimeout`` (the classifier's ``connection``
  and ``timeout``; never a bare ``TimeoutError``, which the driver reads as its own deadline);
- a body over the response-size limit raises :class:`~app.routing.body_limit.ResponseTooLarge`
  (declared too large: before reading a byte of it; undeclared: as soon as it passes);
- a stream is decoded by the SDK's own SSE decoder and read as the SDK reads it: ``[DONE]`` ends
  it, an event whose data has an ``error`` raises ``openai.APIError``.

Cancelling a request (the caller went away, a deadline) closes its connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx2
import openai
from openai._streaming import SSEDecoder

from app.routing.body_limit import ResponseTooLarge
from core import fastjson

__all__ = ["HttpUpstream", "UpstreamAnswer", "UpstreamStream"]

READ_CHUNK = 64 * 1024


def _too_large(limit: int, declared: int | None = None) -> ResponseTooLarge:
    got = f"declared {declared:,} bytes" if declared is not None else "more than that"
    return ResponseTooLarge(f"upstream response larger than the limit of {limit:,} bytes ({got})")


def _transport_error(exc: aiohttp.ClientError) -> httpx2.TransportError:
    """The httpx2 exception the SDK's transport would have raised for ``exc``."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(text)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx2.ReadTimeout(text)
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.InvalidURL):
        return httpx2.ConnectError(text)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return httpx2.RemoteProtocolError(text)
    return httpx2.ReadError(text)


class UpstreamAnswer:
    """A non-streamed 2xx answer: what the router reads of ``httpx2.Response``."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes):
        self.status_code = status_code
        self.headers = headers
        self.content = content


class UpstreamStream:
    """A streamed 2xx answer: ``async with``, then ``async for`` the events' JSON objects, as the
    SDK's ``AsyncStream[object]``; ``.response.headers`` for the upstream's headers."""

    def __init__(self, upstream: HttpUpstream, response: aiohttp.ClientResponse, url: str):
        self._upstream = upstream
        self._response = response
        self._url = url
        self.response = self  # the SDK stream's ``.response.headers``
        self.headers: Mapping[str, str] = response.headers

    async def __aenter__(self) -> UpstreamStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        # Not read to its end (the caller left, a failure): aiohttp closes the connection.
        self._response.release()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _bytes(self) -> AsyncIterator[bytes]:
        limit = self._upstream.max_response_bytes
        total = 0
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                total += len(chunk)
                if total > limit:
                    # The part within the limit goes on (whatever size the socket reads came in,
                    # exactly ``limit`` bytes are delivered), then the stream fails.
                    fits = chunk[: len(chunk) - (total - limit)]
                    if fits:
                        yield fits
                    self._response.close()
                    raise _too_large(limit)
                yield chunk
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc

    async def _events(self) -> AsyncIterator[Any]:
        async for sse in SSEDecoder().aiter_bytes(self._bytes()):
            if sse.data.startswith("[DONE]"):
                break
            data = fastjson.loads(sse.data)
            if sse.event and sse.event.startswith("thread."):
                if sse.event == "error" and isinstance(data, Mapping) and data.get("error"):
                    raise _stream_error(data, self._url)
                yield {"data": data, "event": sse.event}
                continue
            if isinstance(data, Mapping) and data.get("error"):
                raise _stream_error(data, self._url)
            yield data
        self._response.release()


def _stream_error(data: Mapping[str, Any], url: str) -> openai.APIError:
    error = data.get("error")
    message = error.get("message") if isinstance(error, Mapping) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=httpx2.Request("POST", url), body=data["error"])


class HttpUpstream:
    """One provider's upstream: ``await post(path, body, headers, timeout_s, stream)``.

    ``default_headers`` are the SDK client's own (key, user agent, platform), so the upstream sees
    the same request; ``sdk`` builds the status errors. ``limit`` sizes the connection pool."""

    def __init__(
        self,
        base_url: str,
        *,
        sdk: openai.AsyncOpenAI,
        limit: int,
        max_response_bytes: int,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_response_bytes = max_response_bytes
        self._sdk = sdk
        headers = {k: v for k, v in sdk.default_headers.items() if isinstance(v, str)}
        headers["Content-Type"] = "application/json"
        headers["Authorization"] = f"Bearer {sdk.api_key}"  # the SDK adds it per request (bearer_auth)
        self._headers = headers
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # on the event loop (aiohttp binds to the running loop)
            connector = aiohttp.TCPConnector(limit=self._limit, limit_per_host=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None,
        timeout_s: float,
        stream: bool,
    ) -> UpstreamAnswer | UpstreamStream:
        url = f"{self.base_url}/{path.lstrip('/')}"
        # As the SDK's httpx2 timeout: each connect and each read within the attempt's timeout.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        try:
            response = await self._client().post(
                url,
                data=fastjson.dumps(body),
                headers=headers or None,
                timeout=timeout,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc
        try:
            declared = response.content_length
            if declared is not None and declared > self.max_response_bytes:
                response.close()
                raise _too_large(self.max_response_bytes, declared)
            if response.status >= 300:
                raise await self._status_error(response, url)
            if stream:
                return UpstreamStream(self, response, url)
            content = await self._read(response)
            return UpstreamAnswer(response.status, response.headers, content)
        except aiohttp.ClientError as exc:
            response.close()
            raise _transport_error(exc) from exc
        except BaseException:
            response.close()
            raise

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        if response.content_length is not None:  # within the limit (checked): the parser reads no more
            return await response.read()
        parts: list[bytes] = []
        total = 0
        while True:
            chunk = await response.content.readany()
            if not chunk:
                response.release()
                return b"".join(parts)
            total += len(chunk)
            if total > self.max_response_bytes:
                response.close()
                raise _too_large(self.max_response_bytes)
            parts.append(chunk)

    async def _status_error(self, response: aiohttp.ClientResponse, url: str) -> openai.APIStatusError:
        """The SDK's exception for this non-2xx response, built by the SDK from its bytes."""
        content = await self._read(response)
        rebuilt = httpx2.Response(
            response.status,
            headers=list(response.headers.items()),
            content=content,
            request=httpx2.Request("POST", url),
        )
        return self._sdk._make_status_error_from_response(rebuilt)
