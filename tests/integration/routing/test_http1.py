"""The server's upstream HTTP/1.1 client (app.routing.http1) against real loopback servers that
answer with raw bytes: connection reuse, every framing an upstream may use, and each failure as the
httpx2 exception the router classifies."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Awaitable, Callable

import httpx2
import pytest

from app.routing.http1 import Http1Pool

BODY = b'{"id":"x","choices":[]}'

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class Server:
    """A loopback server: ``handler(reader, writer, n)`` answers the n-th request of a connection."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                try:
                    self.requests.append(await _read_request(reader))
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                await self.handler(reader, writer, n)
                n += 1
                if writer.is_closing():
                    return
        finally:
            writer.close()


def fixed(body: bytes = BODY, extra: bytes = b"", status: bytes = b"200 OK") -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body)
        await writer.drain()

    return handler


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_keep_alive_connections_are_reused_and_the_request_is_whole() -> None:
    async def go() -> None:
        async with Server(fixed()) as srv:
            pool = Http1Pool(srv.url, {"Authorization": "Bearer k", "Content-Type": "application/json"})
            for _ in range(5):
                r = await pool.post("chat/completions", b'{"a":1}', {"X-Extra": "yes"}, 5)
                assert r.status_code == 200
                assert await r.read(1 << 20) == BODY
            assert srv.connections == 1  # one connection for five requests
            head, body = srv.requests[0]
            assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            assert b"\r\nHost: 127.0.0.1:" in head and b"\r\nAuthorization: Bearer k\r\n" in head
            assert b"\r\nX-Extra: yes\r\n" in head and body == b'{"a":1}'
            await pool.aclose()

    run(go())


def test_connection_close_is_not_reused() -> None:
    async def go() -> None:
        async with Server(fixed(extra=b"Connection: close\r\n")) as srv:
            pool = Http1Pool(srv.url, {})
            for _ in range(3):
                r = await pool.post("x", b"{}", None, 5)
                assert await r.read(1 << 20) == BODY
            assert srv.connections == 3

    run(go())


def test_chunked_and_gzip_and_deflate_bodies_are_decoded() -> None:
    raw = b'{"choices":[{"message":{"content":"' + b"h\xc3\xa9llo " * 2000 + b'"}}]}'

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        payload = gzip.compress(raw) if n == 1 else zlib.compress(raw) if n == 2 else raw
        enc = b"Content-Encoding: gzip\r\n" if n == 1 else b"Content-Encoding: deflate\r\n" if n == 2 else b""
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + enc + b"\r\n")
        for i in range(0, len(payload), 777):
            part = payload[i : i + 777]
            writer.write(b"%x\r\n" % len(part) + part + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def go() -> None:
        async with Server(chunked) as srv:
            pool = Http1Pool(srv.url, {})
            for _ in range(3):
                r = await pool.post("x", b"{}", None, 5)
                assert r.content_length is None
                assert await r.read(1 << 22) == raw
            assert srv.connections == 1

    run(go())


def test_repeated_headers_are_joined_and_names_lowercased() -> None:
    async def go() -> None:
        extra = b"X-RateLimit-Remaining: 7\r\nVia: a\r\nVia: b\r\n"
        async with Server(fixed(extra=extra)) as srv:
            r = await Http1Pool(srv.url, {}).post("x", b"{}", None, 5)
            assert r.headers["x-ratelimit-remaining"] == "7" and r.headers["via"] == "a, b"
            assert ("X-RateLimit-Remaining", "7") in r.raw_headers

    run(go())


def test_a_silent_upstream_is_a_read_timeout_and_its_connection_is_dropped() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await asyncio.sleep(30)

    async def go() -> None:
        async with Server(silent) as srv:
            pool = Http1Pool(srv.url, {})
            with pytest.raises(httpx2.ReadTimeout):
                await pool.post("x", b"{}", None, 0.3)
            assert pool._idle == [] and not pool._all

    run(go())


def test_a_body_that_stalls_mid_way_is_a_read_timeout() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        await asyncio.sleep(30)

    async def go() -> None:
        async with Server(stall) as srv:
            r = await Http1Pool(srv.url, {}).post("x", b"{}", None, 0.3)
            with pytest.raises(httpx2.ReadTimeout):
                await r.read(1 << 20)

    run(go())


def test_a_connection_closed_before_the_end_is_a_protocol_error() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        writer.close()

    async def go() -> None:
        async with Server(cut) as srv:
            r = await Http1Pool(srv.url, {}).post("x", b"{}", None, 5)
            with pytest.raises(httpx2.RemoteProtocolError):
                await r.read(1 << 20)

    run(go())


def test_garbage_instead_of_http_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    async def go() -> None:
        async with Server(garbage) as srv:
            with pytest.raises(httpx2.RemoteProtocolError):
                await Http1Pool(srv.url, {}).post("x", b"{}", None, 5)

    run(go())


def test_nobody_listening_is_a_connect_error() -> None:
    async def go() -> None:
        async with Server(fixed()) as srv:
            url = srv.url
        with pytest.raises(httpx2.ConnectError):
            await Http1Pool(url, {}).post("x", b"{}", None, 5)

    run(go())


def test_a_body_over_the_limit_fails_as_soon_as_it_passes() -> None:
    async def go() -> None:
        async with Server(fixed(body=b"x" * 10_000)) as srv:
            r = await Http1Pool(srv.url, {}).post("x", b"{}", None, 5)
            with pytest.raises(OverflowError):
                await r.read(1000)

    run(go())


def test_a_cancelled_request_closes_its_connection() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await asyncio.sleep(30)

    async def go() -> None:
        async with Server(slow) as srv:
            pool = Http1Pool(srv.url, {})
            task = asyncio.ensure_future(pool.post("x", b"{}", None, 30))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert pool._idle == [] and not pool._all

    run(go())


def test_a_stream_left_early_is_not_reused_and_the_next_request_is_clean() -> None:
    async def sse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(50):
            event = b'data: {"i": %d}\n\n' % i
            writer.write(b"%x\r\n" % len(event) + event + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def go() -> None:
        async with Server(sse) as srv:
            pool = Http1Pool(srv.url, {})
            r = await pool.post("x", b"{}", None, 5)
            async for chunk in r.iter_bytes():
                assert chunk.startswith(b"data: ")
                break
            r.close()
            r2 = await pool.post("x", b"{}", None, 5)
            got = b"".join([c async for c in r2.iter_bytes()])
            assert got.count(b"data: ") == 50
            assert srv.connections == 2

    run(go())


def test_idle_connections_past_the_keep_alive_limit_are_not_reused() -> None:
    async def go() -> None:
        async with Server(fixed()) as srv:
            pool = Http1Pool(srv.url, {}, keepalive_s=0.05)
            for _ in range(2):
                r = await pool.post("x", b"{}", None, 5)
                await r.read(1 << 20)
                await asyncio.sleep(0.15)
            assert srv.connections == 2

    run(go())


def test_a_header_with_a_line_break_is_refused_before_sending() -> None:
    async def go() -> None:
        async with Server(fixed()) as srv:
            with pytest.raises(httpx2.LocalProtocolError):
                await Http1Pool(srv.url, {}).post("x", b"{}", {"X-Bad": "a\r\nX-Injected: 1"}, 5)
            assert srv.requests == []

    run(go())
