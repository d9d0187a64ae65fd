"""A small HTTP/1.1 client for the server's upstream calls: keep-alive connections per origin, one
write per request, responses parsed by httptools (llhttp, the C parser uvicorn already uses here).

Why not a general client: per request, aiohttp spent 0.25 ms of CPU and pyreqwest 0.10 ms where
this spends 0.058 ms (one process, 64 concurrent POSTs to nginx on loopback; ``python -m benchmarks
upstream-clients`` measures them side by side), and on a proxy hop aiohttp's share was a sixth of
the whole request. It does only what an OpenAI upstream needs: ``POST`` with a body, ``Content-Length`` or
chunked answers, ``gzip``/``deflate`` bodies, TLS (the system's trust store, as aiohttp's default),
no redirects (never followed), no cookies, no HTTP/2, no proxy (as before: the client it replaces
ran with ``trust_env=False``).

Failures are the httpx2 exceptions the SDK's transport raises, so the router classifies them as it
always has: ``ConnectError`` / ``ConnectTimeout`` before a connection, ``ReadTimeout`` when no byte
came within the read timeout, ``RemoteProtocolError`` for a connection closed or a response that
does not parse, ``ReadError`` for other socket errors. A connection is reused only after a whole
response was read and both sides said keep-alive; anything else (a cancel, a failure, a stream
left early, ``Connection: close``) closes it, so a half-read answer never meets the next request.
Idle connections are dropped after ``KEEPALIVE_S`` (below every common server's idle limit) or as
soon as the server closes them.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools
import httpx2

__all__ = ["Http1Pool", "Http1Response"]

KEEPALIVE_S = 15.0  # aiohttp's default idle limit for a pooled connection
HIGH_WATER = 256 * 1024  # a stream's unread bytes before the socket stops being read
_DONE = object()


class _Conn(asyncio.Protocol):
    """One upstream connection. Between requests it is idle; during one, it feeds the parser and
    wakes the reader (``_waiter``) on headers, body chunks and the end."""

    def __init__(self, pool: Http1Pool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.raw_headers: list[tuple[str, str]] = []
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.error: BaseException | None = None
        self.last_read = 0.0
        self._waiter: asyncio.Future | None = None
        self.decoder: zlib._Decompress | None = None

    # ---------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx2.RemoteProtocolError(f"the upstream's response does not parse: {exc}"))
            return
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close the transport: we never send after the server stopped

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if not self.complete:
            if exc is not None:
                err: BaseException = httpx2.ReadError(str(exc) or type(exc).__name__)
            else:
                err = httpx2.RemoteProtocolError("the upstream closed the connection before the response was complete")
            self._fail(err)

    # ---------------------------------------------------------------- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Read now: llhttp forgets it once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        for k, v in self.raw_headers:
            if k.lower() == "content-encoding":
                enc = v.strip().lower()
                if enc == "gzip":
                    self.decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
                elif enc == "deflate":
                    self.decoder = zlib.decompressobj()
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.decoder is not None:
            try:
                body = self.decoder.decompress(body)
            except zlib.error as exc:
                self._fail(httpx2.RemoteProtocolError(f"the upstream's compressed body is corrupt: {exc}"))
                return
            if not body:
                return
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        if self.decoder is not None:
            tail = self.decoder.flush()
            if tail:
                self.chunks.append(tail)
                self.buffered += len(tail)
        self.complete = True
        self._wake()

    # ---------------------------------------------------------------- the reader's side
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = err
        self.close()
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until something new arrived (headers, a chunk, the end, a failure); ``ReadTimeout`` when
        no byte came for ``timeout_s``."""
        loop = asyncio.get_running_loop()
        while True:
            if self.error is not None:
                raise self.error
            self._waiter = loop.create_future()
            left = self.last_read + timeout_s - time.monotonic()
            if left <= 0:
                self.close()
                raise httpx2.ReadTimeout(f"no byte from the upstream for {timeout_s:g} s")
            handle = loop.call_later(left, self._wake)
            try:
                before = self.last_read
                await self._waiter
            finally:
                handle.cancel()
                self._waiter = None
            if self.error is not None:
                raise self.error
            if self.last_read != before or self.complete or self.headers_done:
                return

    def take(self) -> bytes | None:
        """The next decoded body bytes, or ``None`` when none is buffered now."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self.pool._forget(self)


class Http1Response:
    """A response whose headers were read: ``.status_code``, ``.headers`` (lower-case names),
    ``.content_length``; the body by ``await read(limit)`` or ``async for chunk in iter_bytes()``.
    ``close()`` drops the connection (a body not read to its end); ``release()`` after the end
    returns it to the pool."""

    def __init__(self, conn: _Conn, timeout_s: float):
        self._conn = conn
        self._timeout_s = timeout_s
        self.status_code = conn.status
        self.raw_headers = conn.raw_headers  # as sent: order, case and repeats
        # Lower-case names; a repeated header's values joined with ", " (RFC 9110 5.3).
        headers: dict[str, str] = {}
        for k, v in conn.raw_headers:
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        self.headers = headers
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self._done = False

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            chunk = conn.take()
            if chunk is not None:
                yield chunk
                continue
            if conn.complete:
                self.release()
                return
            await conn.wait(self._timeout_s)

    async def read(self, limit: int) -> bytes:
        """The whole body; :class:`OverflowError` as soon as it passes ``limit`` bytes."""
        parts: list[bytes] = []
        total = 0
        async for chunk in self.iter_bytes():
            total += len(chunk)
            if total > limit:
                self.close()
                raise OverflowError(total)
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        if conn.complete and not conn.closed and conn.error is None and conn.keep_alive:
            conn.pool._give_back(conn)
        else:
            conn.close()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._conn.close()


def _fields(headers: Mapping[str, str]) -> bytes:
    """Header lines as sent; a name or value with a line break (header injection) is refused."""
    lines = []
    for k, v in headers.items():
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k:
            raise httpx2.LocalProtocolError(f"header {k!r} has a line break")
        lines.append(f"{k}: {v}\r\n")
    try:
        return "".join(lines).encode("latin-1", "strict")
    except UnicodeEncodeError:
        raise httpx2.LocalProtocolError("a header is not latin-1") from None


class Http1Pool:
    """Keep-alive connections to one origin (``base_url``'s scheme, host and port).

    ``await pool.post(path, body, headers, timeout_s)`` sends one request and returns once the
    response's headers are in. ``timeout_s`` bounds the connect and each wait for bytes, as the
    SDK's httpx2 timeout does. The number of connections is the caller's to bound (the server's
    :class:`~app.routing.pool.ProviderPool` slots); idle ones are reused last-in first-out."""

    def __init__(self, base_url: str, default_headers: Mapping[str, str], *, keepalive_s: float = KEEPALIVE_S):
        self.keepalive_s = keepalive_s
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        host = self.host if ":" not in self.host else f"[{self.host}]"
        self.host_header = host if default_port else f"{host}:{self.port}"
        fixed = {"Host": self.host_header, "Accept-Encoding": "gzip, deflate", **default_headers}
        self._fixed = fixed
        self._fixed_fields = _fields(fixed)
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self.closed = False

    def _head(self, path: str, headers: Mapping[str, str] | None, length: int) -> bytes:
        if headers:
            merged = {**self._fixed, **headers}
            fields = _fields(merged)
        else:
            fields = self._fixed_fields  # the common case: built once
        start = f"POST {self.prefix}/{path.lstrip('/')} HTTP/1.1\r\n".encode("latin-1")
        return b"%s%sContent-Length: %d\r\n\r\n" % (start, fields, length)

    async def _connect(self, timeout_s: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Conn(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except TimeoutError:
            raise httpx2.ConnectTimeout(f"no connection to {self.host_header} within {timeout_s:g} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx2.ConnectError(f"cannot connect to {self.host_header}: {exc}") from None
        self._all.add(conn)
        return conn

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.keepalive_s:
                conn.close()
                continue
            return conn
        return None

    async def post(self, path: str, body: bytes, headers: Mapping[str, str] | None, timeout_s: float) -> Http1Response:
        if self.closed:
            raise httpx2.ConnectError("the upstream client is closed")
        head = self._head(path, headers, len(body))
        conn = self._take_idle() or await self._connect(timeout_s)
        conn._reset()
        conn.last_read = time.monotonic()
        try:
            assert conn.transport is not None
            conn.transport.write(head + body)
            while not conn.headers_done:
                await conn.wait(timeout_s)
        except BaseException:
            conn.close()  # cancelled or failed before the headers: never reused
            raise
        return Http1Response(conn, timeout_s)

    def _give_back(self, conn: _Conn) -> None:
        if self.closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _forget(self, conn: _Conn) -> None:
        self._all.discard(conn)

    async def aclose(self) -> None:
        self.closed = True
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
