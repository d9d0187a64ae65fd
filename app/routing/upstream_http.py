"""The async driver's HTTP client for real (``http(s)://``) upstreams, without the SDK:
:class:`~app.routing.http1.Http1Pool` (keep-alive HTTP/1.1 on httptools).

Measured side by side in one process against nginx returning a fixed completion (2 cores shared;
``python -m benchmarks upstream-clients``), CPU per request of the client alone, 64 at once:

| client                                    | CPU per request |
|-------------------------------------------|-----------------|
| openai SDK ``AsyncOpenAI.post`` on httpx2 | 1.93 ms         |
| httpx2 ``AsyncClient`` directly           | 1.73 ms         |
| aiohttp ``ClientSession`` (C parser)      | 0.25 ms         |
| pyreqwest (Rust reqwest, its own thread)  | 0.10 ms         |
| :mod:`app.routing.http1` (httptools)      | 0.058 ms        |

httpcore2's pool checks every idle connection's socket on each request
(``_assign_requests_to_connections``) and the SDK adds request construction on top; aiohttp builds
a URL object, a header multidict and a request object per call. The simulator and tests' injected
transports keep the SDK on httpx2 (:mod:`app.routing.async_client`).

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

import httpx2
import openai
from openai._streaming import SSEDecoder

from app.routing.body_limit import ResponseTooLarge
from app.routing.http1 import Http1Pool, Http1Response
from core import fastjson

__all__ = ["HttpUpstream", "UpstreamAnswer", "UpstreamStream"]

READ_CHUNK = 64 * 1024


def _too_large(limit: int, declared: int | None = None) -> ResponseTooLarge:
    got = f"declared {declared:,} bytes" if declared is not None else "more than that"
    return ResponseTooLarge(f"upstream response larger than the limit of {limit:,} bytes ({got})")


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

    def __init__(self, upstream: HttpUpstream, response: Http1Response, url: str):
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
        # Not read to its end (the caller left, a failure): the connection is closed, never reused.
        self._response.close()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._events()

    async def _bytes(self) -> AsyncIterator[bytes]:
        limit = self._upstream.max_response_bytes
        total = 0
        async for chunk in self._response.iter_bytes():
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
        self._response.release()  # after [DONE]: reused if the body ended there, else closed


def _stream_error(data: Mapping[str, Any], url: str) -> openai.APIError:
    error = data.get("error")
    message = error.get("message") if isinstance(error, Mapping) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=httpx2.Request("POST", url), body=data["error"])


class HttpUpstream:
    """One provider's upstream: ``await post(path, body, headers, timeout_s, stream)``.

    ``default_headers`` are the SDK client's own (key, user agent, platform), so the upstream sees
    the same request; ``sdk`` builds the status errors. The number of connections is bounded by
    the server's :class:`~app.routing.pool.ProviderPool` slots, taken before each call."""

    def __init__(
        self,
        base_url: str,
        *,
        sdk: openai.AsyncOpenAI,
        max_response_bytes: int,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_response_bytes = max_response_bytes
        self._sdk = sdk
        headers = {k: v for k, v in sdk.default_headers.items() if isinstance(v, str)}
        headers["Content-Type"] = "application/json"
        headers["Authorization"] = f"Bearer {sdk.api_key}"  # the SDK adds it per request (bearer_auth)
        self._pool = Http1Pool(self.base_url, headers)

    async def aclose(self) -> None:
        await self._pool.aclose()

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
        response = await self._pool.post(path, fastjson.dumps(body), headers or None, timeout_s)
        try:
            declared = response.content_length
            if declared is not None and declared > self.max_response_bytes:
                response.close()
                raise _too_large(self.max_response_bytes, declared)
            if response.status_code >= 300:
                raise await self._status_error(response, url)
            if stream:
                return UpstreamStream(self, response, url)
            content = await self._read(response)
            return UpstreamAnswer(response.status_code, response.headers, content)
        except BaseException:
            response.close()
            raise

    async def _read(self, response: Http1Response) -> bytes:
        try:
            return await response.read(self.max_response_bytes)
        except OverflowError:
            raise _too_large(self.max_response_bytes) from None

    async def _status_error(self, response: Http1Response, url: str) -> openai.APIStatusError:
        """The SDK's exception for this non-2xx response, built by the SDK from its bytes."""
        content = await self._read(response)
        rebuilt = httpx2.Response(
            response.status_code,
            headers=response.raw_headers,
            content=content,
            request=httpx2.Request("POST", url),
        )
        return self._sdk._make_status_error_from_response(rebuilt)
