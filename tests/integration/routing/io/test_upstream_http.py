"""The server's upstream client (app.routing.io.upstream_http on pyreqwest) against raw loopback
servers that answer as hostile or merely unusual upstreams do: interim 1xx answers, bytes after a
response, header floods, compression bombs, proxies, private CAs and mutual TLS. Where one
connection is shared, two callers each must get only their own answer."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import os
import ssl
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx2
import openai
import pytest

from app import netconf
from app.routing.errors import BadResponse
from app.routing.io.body_limit import ResponseTooLarge
from app.routing.io.upstream_http import BACKSTOP_S, KEEPALIVE_S, HttpUpstream, UpstreamAnswer, UpstreamStream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes, int], Awaitable[None]]
LIMIT = 1 << 20


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


class Server:
    """A loopback server: ``handler(reader, writer, body, n)`` answers the n-th request of a
    connection with raw bytes; ``ssl`` makes it HTTPS."""

    def __init__(self, handler: Handler, ssl_ctx: ssl.SSLContext | None = None):
        self.handler = handler
        self.ssl = ssl_ctx
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0, ssl=self.ssl)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{'localhost' if self.ssl else '127.0.0.1'}:{self.port}/v1"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                try:
                    head, body = await _read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                    return
                self.heads.append(head)
                await self.handler(reader, writer, body, n)
                n += 1
                if writer.is_closing():
                    return
        finally:
            writer.close()


def answer(body: bytes, extra: bytes = b"", status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + extra + b"\r\n" + body


def echo_who(prefix: bytes = b"", suffix: Callable[[bytes], bytes] = lambda who: b"") -> Handler:
    """Answers ``{"who": <the caller's who>}``, with ``prefix`` before and ``suffix(who)`` after."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        who = body.split(b'"who":"', 1)[1].split(b'"', 1)[0]
        writer.write(prefix + answer(b'{"who":"%s"}' % who) + suffix(who))
        await writer.drain()

    return handler


def upstream(url: str, *, limit: int = LIMIT, net: netconf.NetConf | None = None) -> HttpUpstream:
    sdk = openai.AsyncOpenAI(api_key="sk-test", base_url=url, max_retries=0)
    return HttpUpstream(url, sdk=sdk, max_response_bytes=limit, net=net, connect_timeout_s=5)


async def call(up: HttpUpstream, who: str = "A", *, timeout: float = 5.0) -> bytes:
    got = await up.post("chat/completions", {"who": who}, headers=None, timeout_s=timeout, stream=False)
    assert isinstance(got, UpstreamAnswer)
    return got.content


def run(coro: Awaitable[object]) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- 1: interim answers ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "interim", [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"]
)
def test_interim_1xx_answers_are_read_past_and_each_caller_gets_its_own_answer(interim: bytes) -> None:
    async def main() -> None:
        async with Server(echo_who(prefix=interim)) as srv:
            up = upstream(srv.url)
            try:
                got = [await call(up, who) for who in ("A", "B", "C")]
            finally:
                await up.aclose()
            assert got == [b'{"who":"A"}', b'{"who":"B"}', b'{"who":"C"}']
            assert srv.connections == 1  # one kept-alive connection, never shifted by the 1xx

    run(main())


# -- 2: bytes after the end of a response --------------------------------------------------------
def test_a_second_response_in_the_same_read_never_reaches_the_next_caller() -> None:
    smuggled = lambda who: answer(b'{"who":"SMUGGLED"}')  # noqa: E731

    async def main() -> None:
        async with Server(echo_who(suffix=smuggled)) as srv:
            up = upstream(srv.url)
            try:
                first = await call(up, "A")
                second = await call(up, "B")
            finally:
                await up.aclose()
            assert first == b'{"who":"A"}'
            assert second == b'{"who":"B"}'
            assert srv.connections == 2  # the connection with bytes past its answer was dropped

    run(main())


def test_a_stray_response_on_an_idle_connection_closes_it() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        await echo_who()(reader, writer, body, n)
        await asyncio.sleep(0.1)
        writer.write(answer(b'{"who":"STRAY"}'))  # unasked, on the now idle connection
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                assert await call(up, "A") == b'{"who":"A"}'
                await asyncio.sleep(0.3)
                assert await call(up, "B") == b'{"who":"B"}'
            finally:
                await up.aclose()
            assert srv.connections == 2

    run(main())


# -- 3: header floods ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "head", [b"X-A: b\r\n" * 200_000, b"X-Big: " + b"a" * (16 << 20) + b"\r\n"], ids=["200k-lines", "16MiB-header"]
)
def test_a_flood_of_headers_is_refused_quickly(head: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"Content-Length: 2\r\n\r\n{}")
        try:
            await writer.drain()
        except ConnectionError:
            pass

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            cpu = time.process_time()
            try:
                with pytest.raises(httpx2.RemoteProtocolError, match="too large"):
                    await call(up)
            finally:
                await up.aclose()
            assert time.process_time() - cpu < 2.0  # no quadratic joining (was 9.4 s for 200k lines)

    run(main())


# -- 4: compression bombs ------------------------------------------------------------------------
def test_a_gzip_bomb_fails_at_the_limit_without_inflating_it_whole() -> None:
    bomb = gzip.compress(b"\0" * (256 << 20), 9)  # 256 MiB inflated, ~250 KB on the wire

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        writer.write(answer(bomb, b"Content-Encoding: gzip\r\n"))
        try:
            await writer.drain()
        except ConnectionError:
            pass

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url, limit=LIMIT)
            tracemalloc.start()
            try:
                with pytest.raises(ResponseTooLarge):
                    await call(up)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
                await up.aclose()
            assert peak < 8 * LIMIT  # the inflated bytes held never pass the limit by much

    run(main())


# -- 6: a body that ends with the connection ------------------------------------------------------
def test_a_body_without_length_is_read_to_the_end_of_the_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"who":"eof"}')
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                assert await call(up) == b'{"who":"eof"}'
                assert await call(up) == b'{"who":"eof"}'
            finally:
                await up.aclose()
            assert srv.connections == 2

    run(main())


# -- 7 and 8: streams ----------------------------------------------------------------------------
def _chunk(text: str) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode()


def chunked(*parts: bytes) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]


def stream_handler(parts: list[bytes], gap: float = 0.0) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in parts:
            writer.write(part)
            await writer.drain()
            if gap:
                await asyncio.sleep(gap)

    return handler


async def read_stream(up: HttpUpstream, pause: float = 0.0) -> list[object]:
    got = await up.post("chat/completions", {"who": "s"}, headers=None, timeout_s=5, stream=True)
    assert isinstance(got, UpstreamStream)
    out = []
    async with got:
        async for event in got:
            out.append(event)
            if pause:
                await asyncio.sleep(pause)
    return out


def test_done_in_a_read_of_its_own_still_reuses_the_connection() -> None:
    parts = chunked(_chunk("a"), _chunk("b"), b"data: [DONE]\n\n")

    async def main() -> None:
        async with Server(stream_handler(parts, gap=0.05)) as srv:
            up = upstream(srv.url)
            try:
                for _ in range(3):
                    events = await read_stream(up)
                    assert [e["choices"][0]["delta"]["content"] for e in events] == ["a", "b"]  # type: ignore[index]
                    await asyncio.sleep(0.2)  # the end of the body is read in the background
            finally:
                await up.aclose()
            assert srv.connections == 1

    run(main())


def test_a_slow_reader_gets_every_event_and_no_timeout() -> None:
    parts = chunked(*[_chunk(str(i)) for i in range(5)], b"data: [DONE]\n\n")

    async def main() -> None:
        async with Server(stream_handler(parts, gap=0.01)) as srv:
            up = upstream(srv.url)
            try:
                events = await read_stream(up, pause=0.3)
            finally:
                await up.aclose()
            assert len(events) == 5

    run(main())


def test_an_error_event_in_a_stream_raises_the_sdk_error() -> None:
    parts = chunked(_chunk("a"), b'data: {"error":{"message":"overloaded"}}\n\n')

    async def main() -> None:
        async with Server(stream_handler(parts)) as srv:
            up = upstream(srv.url)
            try:
                with pytest.raises(openai.APIError, match="overloaded"):
                    await read_stream(up)
            finally:
                await up.aclose()

    run(main())


# -- 9: content codings --------------------------------------------------------------------------
def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        (b"gzip", gzip.compress(b'{"who":') + gzip.compress(b'"multi"}')),
        (b"deflate", zlib.compress(b'{"who":"zlib"}')),
        (b"deflate", _raw_deflate(b'{"who":"raw"}')),
        (b"gzip, gzip", gzip.compress(gzip.compress(b'{"who":"twice"}'))),
        (b"x-gzip", gzip.compress(b'{"who":"x"}')),
    ],
    ids=["multi-member-gzip", "zlib-deflate", "raw-deflate", "gzip-gzip", "x-gzip"],
)
def test_every_coding_is_decoded_whole(coding: bytes, body: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        writer.write(answer(body, b"Content-Encoding: " + coding + b"\r\n"))
        await writer.drain()

    async def main() -> bytes:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                return await call(up)
            finally:
                await up.aclose()

    got = run(main())
    assert isinstance(got, bytes) and got.startswith(b'{"who":') and got.endswith(b'"}')
    assert got in (b'{"who":"multi"}', b'{"who":"zlib"}', b'{"who":"raw"}', b'{"who":"twice"}', b'{"who":"x"}')


@pytest.mark.parametrize(
    ("coding", "body", "message"),
    [
        (b"br", b"\x1b\x03\x00", "Content-Encoding br"),
        (b"gzip", gzip.compress(b'{"who":"cut"}')[:-6], "ended before"),
    ],
    ids=["br-unasked", "truncated-gzip"],
)
def test_a_coding_that_cannot_be_decoded_is_refused_by_name(coding: bytes, body: bytes, message: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        writer.write(answer(body, b"Content-Encoding: " + coding + b"\r\n"))
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                with pytest.raises(BadResponse, match=message):
                    await call(up)
            finally:
                await up.aclose()
            assert b"accept-encoding: gzip, deflate" in srv.heads[0].lower()

    run(main())


# -- status errors, timeouts, connect errors -------------------------------------------------------
def test_a_status_error_is_the_sdks_own_exception_with_the_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        writer.write(answer(b'{"error":{"message":"slow down","type":"rate"}}', b"Retry-After: 2\r\n", b"429 Too Many"))
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                with pytest.raises(openai.RateLimitError) as err:
                    await call(up)
            finally:
                await up.aclose()
            assert err.value.response.headers["retry-after"] == "2"
            assert "slow down" in str(err.value)

    run(main())


def test_a_redirect_is_never_followed() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        writer.write(answer(b"", b"Location: http://127.0.0.1:9/elsewhere\r\n", b"307 Temporary Redirect"))
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                with pytest.raises(openai.APIStatusError) as err:
                    await call(up)
            finally:
                await up.aclose()
            assert err.value.status_code == 307 and len(srv.heads) == 1

    run(main())


def test_a_silent_upstream_is_a_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        await asyncio.sleep(3)

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                with pytest.raises(httpx2.ReadTimeout):
                    await call(up, timeout=0.3)
            finally:
                await up.aclose()

    run(main())


def test_nobody_listening_is_a_connect_error() -> None:
    async def main() -> None:
        up = upstream("http://127.0.0.1:9/v1")
        try:
            with pytest.raises(httpx2.ConnectError, match="could not connect"):
                await call(up)
        finally:
            await up.aclose()

    run(main())


def test_a_cancelled_request_drops_its_connection_and_the_next_caller_is_clean() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        if b'"slow"' in body:
            await asyncio.sleep(0.5)
        await echo_who()(reader, writer, body, n)

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                task = asyncio.ensure_future(call(up, "slow"))
                await asyncio.sleep(0.1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.6)  # the slow answer arrives on the dropped connection, if anywhere
                assert await call(up, "B") == b'{"who":"B"}'
            finally:
                await up.aclose()

    run(main())


def _racing_handler(
    first: bytes, second: bytes, go: asyncio.Event, sent: asyncio.Event, closed: list[float]
) -> Handler:
    """Sends ``first``, then ``second`` once ``go`` is set (``sent`` then), then waits for the
    client to close the connection and notes when."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        writer.write(first)
        await writer.drain()
        await go.wait()
        writer.write(second)
        await writer.drain()
        sent.set()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):
                pass
        closed.append(asyncio.get_running_loop().time())
        writer.close()

    return handler


async def _cancel_as_it_arrives(task: asyncio.Task, go: asyncio.Event, sent: asyncio.Event) -> None:
    """Let the server send, let pyreqwest receive it (the loop held, so the read's completion is
    not yet delivered), then cancel: the cancellation lands on a read whose result is ready."""
    go.set()
    await sent.wait()
    time.sleep(0.05)  # blocks the loop on purpose: the bytes reach pyreqwest, the task has not yet woken
    task.cancel()


async def _consume(up: HttpUpstream, opened: UpstreamStream | None) -> None:
    stream = opened or await up.post("chat/completions", {"who": "s"}, headers=None, timeout_s=30, stream=True)
    assert isinstance(stream, UpstreamStream)
    async with stream:
        async for _event in stream:
            pass  # a stalled upstream: only a cancellation ends this


@pytest.mark.parametrize("where", ["a stream's chunk", "the answer's head"])
def test_a_cancellation_that_lands_as_data_arrives_is_never_lost(where: str) -> None:
    """pyreqwest finishes an await whose result is ready though a cancellation was thrown into it,
    and leaks an answer whose head arrives as the cancellation does. The gateway raises the
    cancellation anyway and the connection is dropped. Ten tries each; before the fix most tries
    lost the cancellation (a chunk) or left the connection open (the head)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    one = chunked(_chunk("a"))[0]
    in_stream = where == "a stream's chunk"

    async def main() -> None:
        for _ in range(10):
            go, sent, closed = asyncio.Event(), asyncio.Event(), []
            first, second = (head + one, chunked(_chunk("b"))[0]) if in_stream else (b"", head + one)
            async with Server(_racing_handler(first, second, go, sent, closed)) as srv:
                up = upstream(srv.url)
                try:
                    opened = None
                    if in_stream:
                        opened = await up.post(
                            "chat/completions", {"who": "s"}, headers=None, timeout_s=30, stream=True
                        )
                        assert isinstance(opened, UpstreamStream)
                    task = asyncio.ensure_future(_consume(up, opened))
                    await asyncio.sleep(0.05)  # the read (or the head) is awaited
                    await _cancel_as_it_arrives(task, go, sent)
                    with pytest.raises(asyncio.CancelledError):
                        await asyncio.wait_for(asyncio.shield(task), 5)
                    for _ in range(100):  # a bound on the wait, not a timing assertion
                        if closed:
                            break
                        await asyncio.sleep(0.05)
                    assert closed, "the upstream connection was left open after the cancellation"
                finally:
                    await up.aclose()

    run(main())


# -- 12: keep-alive idle limit ---------------------------------------------------------------------
def test_an_idle_connection_is_dropped_before_the_common_5_second_server_limit() -> None:
    assert KEEPALIVE_S < 5.0

    async def main() -> None:
        async with Server(echo_who()) as srv:
            up = upstream(srv.url)
            try:
                await call(up, "A")
                await asyncio.sleep(KEEPALIVE_S + 0.7)
                await call(up, "B")
            finally:
                await up.aclose()
            assert srv.connections == 2

    run(main())


# -- 5: proxies ----------------------------------------------------------------------------------
class ForwardProxy:
    """A loopback forward proxy that records what passes: absolute-URI requests (``http://``)
    relayed on a fresh connection each, and ``CONNECT`` tunnels (``https://``)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> ForwardProxy:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        line = head.split(b"\r\n", 1)[0]
        self.seen.append(line)
        method, target, _ = line.split(b" ")
        if method == b"CONNECT":
            host, port = target.rsplit(b":", 1)
            up_r, up_w = await asyncio.open_connection(host.decode(), int(port))
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
            return
        url = httpx2.URL(target.decode())
        up_r, up_w = await asyncio.open_connection(url.host, url.port)
        rest = head.split(b"\r\n", 1)[1]
        up_w.write(b"%s %s HTTP/1.1\r\n" % (method, url.raw_path) + rest)
        await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def test_the_environment_proxy_is_used_for_http_and_no_proxy_exempts_a_host() -> None:
    async def main() -> None:
        async with Server(echo_who()) as srv, ForwardProxy() as proxy:
            env = {"HTTP_PROXY": proxy.url, "NO_PROXY": "example.internal"}
            net = netconf.resolve(srv.url, environ=env)
            assert net.proxy == proxy.url and net.proxy_source == "HTTP_PROXY"
            up = upstream(srv.url, net=net)
            try:
                assert await call(up, "A") == b'{"who":"A"}'
            finally:
                await up.aclose()
            assert proxy.seen and proxy.seen[0].startswith(b"POST http://127.0.0.1:%d/v1/chat" % srv.port)

            exempt = netconf.resolve(srv.url, environ={"HTTP_PROXY": proxy.url, "NO_PROXY": "127.0.0.1"})
            assert exempt.proxy is None
            seen = len(proxy.seen)
            up = upstream(srv.url, net=exempt)
            try:
                assert await call(up, "B") == b'{"who":"B"}'
            finally:
                await up.aclose()
            assert len(proxy.seen) == seen  # straight to the upstream

    run(main())


def test_config_proxy_overrides_the_environment_and_none_turns_it_off() -> None:
    env = {"HTTPS_PROXY": "http://env-proxy:3128", "https_proxy": "http://lower:3128"}
    assert netconf.resolve("https://api.example.com/v1", environ=env).proxy == "http://lower:3128"
    assert (
        netconf.resolve("https://api.example.com/v1", proxy="http://mine:8080", environ=env).proxy == "http://mine:8080"
    )
    assert netconf.resolve("https://api.example.com/v1", proxy="none", environ=env).proxy is None
    assert netconf.resolve("http://api.example.com/v1", environ=env).proxy is None  # HTTPS_PROXY is for https
    assert netconf.resolve("http://x/v1", environ={"ALL_PROXY": "proxy:1"}).proxy == "http://proxy:1"
    assert netconf.resolve("https://a.example.com/v1", environ={**env, "NO_PROXY": ".example.com"}).proxy is None
    assert netconf.resolve("https://a.example.com/v1", environ={**env, "NO_PROXY": "*"}).proxy is None


def test_a_proxy_that_cannot_be_reached_is_named_without_its_password() -> None:
    async def main() -> None:
        net = netconf.resolve("http://api.example.com/v1", proxy="http://user:secret@127.0.0.1:9")
        up = upstream("http://api.example.com/v1", net=net)
        try:
            with pytest.raises(httpx2.ConnectError) as err:
                await call(up)
        finally:
            await up.aclose()
        assert "proxy http://user:***@127.0.0.1:9 (from config)" in str(err.value)
        assert "secret" not in str(err.value)

    run(main())


# -- 11: TLS: a private CA, mutual TLS, and CONNECT through a proxy ---------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A private CA, a server certificate for localhost and a client certificate, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.UTC)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def write(name: str, cert: x509.Certificate, k: ec.EllipticCurvePrivateKey) -> None:
        (d / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{name}.key").write_bytes(
            k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        )

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test private CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    write("ca", ca, ca_key)
    for name, usage, san in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH, [x509.DNSName("localhost")]),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("client")]),
    ):
        k = key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(k.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        write(name, cert, k)
    return {n: d / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def _server_ctx(pki: dict[str, Path], *, require_client: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server.pem"], pki["server.key"])
    ctx.set_alpn_protocols(["http/1.1"])
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki["ca.pem"])
    return ctx


def test_a_private_ca_is_trusted_only_where_configured(pki: dict[str, Path]) -> None:
    async def main() -> None:
        async with Server(echo_who(), _server_ctx(pki)) as srv:
            trusted = upstream(srv.url, net=netconf.resolve(srv.url, ca_bundle=str(pki["ca.pem"]), environ={}))
            untrusted = upstream(srv.url, net=netconf.resolve(srv.url, environ={}))
            try:
                assert await call(trusted, "A") == b'{"who":"A"}'
                with pytest.raises(httpx2.ConnectError, match=r"(?i)certificate|unknown ?issuer"):
                    await call(untrusted, "B")
            finally:
                await trusted.aclose()
                await untrusted.aclose()

    run(main())


def test_mutual_tls_sends_the_client_certificate(pki: dict[str, Path]) -> None:
    async def main() -> None:
        async with Server(echo_who(), _server_ctx(pki, require_client=True)) as srv:
            net = netconf.resolve(
                srv.url,
                ca_bundle=str(pki["ca.pem"]),
                client_cert=str(pki["client.pem"]),
                client_key=str(pki["client.key"]),
                environ={},
            )
            with_cert = upstream(srv.url, net=net)
            without = upstream(srv.url, net=netconf.resolve(srv.url, ca_bundle=str(pki["ca.pem"]), environ={}))
            try:
                assert await call(with_cert, "A") == b'{"who":"A"}'
                with pytest.raises((httpx2.ConnectError, httpx2.RemoteProtocolError, httpx2.ReadError)):
                    await call(without, "B")
            finally:
                await with_cert.aclose()
                await without.aclose()

    run(main())


def test_https_through_a_proxy_is_a_connect_tunnel(pki: dict[str, Path]) -> None:
    async def main() -> None:
        async with Server(echo_who(), _server_ctx(pki)) as srv, ForwardProxy() as proxy:
            net = netconf.resolve(srv.url, ca_bundle=str(pki["ca.pem"]), environ={"HTTPS_PROXY": proxy.url})
            up = upstream(srv.url, net=net)
            try:
                assert await call(up, "A") == b'{"who":"A"}'
            finally:
                await up.aclose()
            assert proxy.seen == [b"CONNECT localhost:%d HTTP/1.1" % srv.port]

    run(main())


# -- exit ------------------------------------------------------------------------------------------
def test_a_process_that_exits_without_closing_its_clients_exits_cleanly() -> None:
    program = textwrap.dedent(
        """
        import asyncio, openai
        from app.routing.io.upstream_http import HttpUpstream
        async def main():
            sdk = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
            up = HttpUpstream("http://127.0.0.1:9/v1", sdk=sdk, max_response_bytes=1 << 20)
            try:
                await up.post("x", {}, headers=None, timeout_s=1, stream=False)
            except Exception:
                pass
            globals()["kept"] = up  # never closed
        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[4])}
    codes = [subprocess.run([sys.executable, "-c", program], env=env, capture_output=True).returncode for _ in range(8)]
    assert codes == [0] * 8


# -- streams are handed on chunk by chunk; cancels ------------------------------------------------
def test_a_streams_first_chunk_arrives_before_the_rest_is_sent() -> None:
    """No read-ahead: the first event reaches the reader while the upstream still waits to send
    the second (a buffered client would hold the first token back)."""
    sent_second = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes, n: int) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunked(_chunk("first"))[0])
        await writer.drain()
        await asyncio.sleep(1.0)
        sent_second.set()
        for part in chunked(_chunk("second"), b"data: [DONE]\n\n"):
            writer.write(part)
        await writer.drain()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                got = await up.post("chat/completions", {"who": "s"}, headers=None, timeout_s=5, stream=True)
                assert isinstance(got, UpstreamStream)
                async with got:
                    events = got.__aiter__()
                    first = await events.__anext__()
                    assert first["choices"][0]["delta"]["content"] == "first"
                    assert not sent_second.is_set()
                    rest = [e async for e in events]
                assert [e["choices"][0]["delta"]["content"] for e in rest] == ["second"]
            finally:
                await up.aclose()

    run(main())


def _watch_close() -> tuple[Handler, asyncio.Event]:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes, n: int) -> None:
        if b'"head"' in body:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(chunked(_chunk("a"))[0])
            await writer.drain()
        if await reader.read(1) == b"":
            closed.set()

    return handler, closed


def test_cancelling_a_stream_that_has_begun_closes_its_connection_at_once() -> None:
    handler, closed = _watch_close()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                got = await up.post("chat/completions", {"who": "head"}, headers=None, timeout_s=30, stream=True)
                assert isinstance(got, UpstreamStream)

                async def read() -> None:
                    async with got:
                        async for _ in got:
                            pass

                task = asyncio.ensure_future(read())
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.wait_for(closed.wait(), 2.0)  # well inside the 30 s timeout
            finally:
                await up.aclose()

    run(main())


def test_a_request_cancelled_before_its_answer_began_ends_by_its_own_timeout() -> None:
    """The one case the library cannot abort at once: bounded by the attempt's timeout, and its
    connection is never handed to another caller."""
    handler, closed = _watch_close()

    async def main() -> None:
        async with Server(handler) as srv:
            up = upstream(srv.url)
            try:
                task = asyncio.ensure_future(call(up, "nohead", timeout=1.0))
                await asyncio.sleep(0.2)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                started = time.monotonic()
                await asyncio.wait_for(closed.wait(), 3.0)
                assert time.monotonic() - started < 1.0 + BACKSTOP_S - 0.2 + 0.5  # its timeout, less the 0.2 s waited
            finally:
                await up.aclose()

    run(main())
