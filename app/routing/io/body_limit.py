"""A bound on how much an upstream may send for one attempt.

An upstream (or something pretending to be one) can answer with a body of any size: a 5 GB "chat
completion", or a stream that never stops sending. Without a bound the gateway buffers a
non-streamed body whole and keeps a stream's text for its result, so one such answer could take the
process's memory, and every request in it, down. Every reader of an upstream body applies one
counting rule (:class:`Budget`): the async driver's HTTP client for real upstreams, and
:class:`AsyncBodyLimitTransport` around the SDK's transport for the rest (the sync client runs the
async driver):

- a response whose ``Content-Length`` is over the limit is refused before a byte of it is read; one
  within it is left alone (the HTTP parser reads no more than the declared length), so the usual
  non-streamed answer costs nothing here;
- a body of undeclared length (chunked: streams) is counted as it arrives, and reading stops as
  soon as it passes the limit.

Either way the attempt fails with :class:`ResponseTooLarge` (a :class:`BadResponse`, so a
``bad_response`` failure that falls over to the next route; after a stream's first text it is a
broken stream), and the connection is closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx2

from app.routing.errors import BadResponse


class ResponseTooLarge(BadResponse):
    """An upstream response passed the configured size limit."""


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The ``Content-Length`` an answer declares, when it is a plain number."""
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def too_large(limit: int, seen: int | None = None) -> ResponseTooLarge:
    got = f"declared {seen:,} bytes" if seen is not None else "more than that"
    return ResponseTooLarge(f"upstream response larger than the limit of {limit:,} bytes ({got})")


class Budget:
    """One response's bytes counted against the limit as they arrive: the one counting rule of
    every reader of a body (the transport here, and the async driver's HTTP client, which counts
    decoded bytes)."""

    __slots__ = ("limit", "total")

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0

    def count(self, piece: bytes) -> bytes:
        """``piece``, counted; :class:`ResponseTooLarge` as soon as the total passes the limit."""
        self.total += len(piece)
        if self.total > self.limit:
            raise too_large(self.limit)
        return piece

    def refuse_declared(self, headers: Mapping[str, str]) -> bool:
        """Whether the answer declares its length within the limit (nothing left to count); raises
        :class:`ResponseTooLarge` when it declares more."""
        declared = declared_length(headers)
        if declared is not None and declared > self.limit:
            raise too_large(self.limit, declared)
        return declared is not None


class _AsyncLimitedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int):
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        budget = Budget(self._limit)
        async for chunk in self._inner:
            yield budget.count(chunk)

    async def aclose(self) -> None:
        await self._inner.aclose()


class AsyncBodyLimitTransport(httpx2.AsyncBaseTransport):
    """Wraps a provider's async transport: at most ``limit`` bytes of response body."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int):
        self.inner = inner
        self.limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        try:
            if Budget(self.limit).refuse_declared(response.headers):
                return response
        except ResponseTooLarge:
            await response.aclose()
            raise
        stream = response.stream
        if isinstance(stream, httpx2.AsyncByteStream):
            response.stream = _AsyncLimitedStream(stream, self.limit)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()
