"""TransportUpstream: a provider reached through an httpx2 transport (the simulator, a test's mock)
is read exactly as a real upstream is: the same size limit on decoded bytes, the same decoding,
the same stream splitting and the same failures. In process, through ``httpx2.MockTransport``."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Callable

import httpx2
import openai
import pytest

from app.routing.io.body_limit import ResponseTooLarge
from app.routing.io.upstream_http import TransportUpstream, UpstreamAnswer, UpstreamStream

LIMIT = 64 * 1024


class _Pieces(httpx2.AsyncByteStream):
    """A body handed on piece by piece, as a transport streams it (never read ahead by httpx2)."""

    def __init__(self, *pieces: bytes):
        self.pieces = pieces
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece

    async def aclose(self) -> None:
        self.closed = True


def _upstream(handler: Callable[[httpx2.Request], httpx2.Response], limit: int = LIMIT) -> TransportUpstream:
    sdk = openai.AsyncOpenAI(api_key="sk-test", base_url="http://upstream.test/v1", max_retries=0)
    return TransportUpstream(
        "http://upstream.test/v1", sdk=sdk, transport=httpx2.MockTransport(handler), max_response_bytes=limit
    )


def _post(upstream: TransportUpstream, *, stream: bool = False):
    async def go():
        try:
            return await upstream.post("chat/completions", {"model": "m"}, headers=None, timeout_s=5, stream=stream)
        finally:
            if not stream:
                await upstream.aclose()

    return go()


def test_the_request_carries_the_key_and_the_body_as_json() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={"ok": True})

    answer = asyncio.run(_post(_upstream(handler)))
    assert isinstance(answer, UpstreamAnswer) and json.loads(answer.content) == {"ok": True}
    (request,) = seen
    assert str(request.url) == "http://upstream.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["accept-encoding"] == "gzip, deflate"
    assert json.loads(request.content) == {"model": "m"}


@pytest.mark.parametrize("pre_read", [False, True], ids=["streamed", "built-with-content"])
def test_a_gzip_body_is_decoded_once_whether_streamed_or_built_with_its_content(pre_read: bool) -> None:
    body = json.dumps({"text": "héllo " * 100}).encode()
    packed = gzip.compress(body)
    headers = {"content-encoding": "gzip", "content-type": "application/json"}

    def handler(request: httpx2.Request) -> httpx2.Response:
        if pre_read:
            return httpx2.Response(200, headers=headers, content=packed)
        return httpx2.Response(200, headers=headers, stream=_Pieces(packed[:10], packed[10:]))

    answer = asyncio.run(_post(_upstream(handler)))
    assert answer.content == body


def test_a_body_past_the_limit_fails_as_it_arrives_and_the_body_is_closed() -> None:
    stream = _Pieces(*([b"x" * 16 * 1024] * 8))

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, stream=stream)

    with pytest.raises(ResponseTooLarge):
        asyncio.run(_post(_upstream(handler)))
    assert stream.closed


def test_a_declared_length_past_the_limit_is_refused_before_reading() -> None:
    stream = _Pieces(b"x")

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-length": str(LIMIT + 1)}, stream=stream)

    with pytest.raises(ResponseTooLarge, match="declared"):
        asyncio.run(_post(_upstream(handler)))
    assert stream.closed


def test_a_compressed_bomb_is_bounded_by_its_decoded_size() -> None:
    bomb = gzip.compress(b"\0" * (16 * 1024 * 1024))  # 16 KB on the wire

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-encoding": "gzip"}, stream=_Pieces(bomb))

    assert len(bomb) < LIMIT
    with pytest.raises(ResponseTooLarge):
        asyncio.run(_post(_upstream(handler)))


def test_a_status_error_is_the_sdks_own_exception() -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(429, json={"error": {"message": "slow down"}}, headers={"retry-after": "2"})

    with pytest.raises(openai.RateLimitError, match="slow down") as caught:
        asyncio.run(_post(_upstream(handler)))
    assert caught.value.response.headers["retry-after"] == "2"


def test_a_stream_is_split_into_events_up_to_done_and_an_error_event_raises() -> None:
    sse = (
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
        b"data: [DONE]\n\n"
        b'data: {"never":"read"}\n\n'
    )

    def handler(request: httpx2.Request) -> httpx2.Response:
        if json.loads(request.content).get("broken"):
            body = b'data: {"error":{"message":"upstream fell over"}}\n\n'
            return httpx2.Response(200, stream=_Pieces(body))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=_Pieces(sse[:7], sse[7:]))

    upstream = _upstream(handler)

    async def go() -> tuple[list[dict], bool]:
        stream = await upstream.post("chat/completions", {}, headers=None, timeout_s=5, stream=True)
        assert isinstance(stream, UpstreamStream)
        async with stream:
            got = [stream.decode(sse) async for sse in stream.raw_events()]
        broken = await upstream.post("chat/completions", {"broken": True}, headers=None, timeout_s=5, stream=True)
        with pytest.raises(openai.APIError, match="upstream fell over"):
            async with broken:
                [broken.decode(sse) async for sse in broken.raw_events()]
        await upstream.aclose()
        return got, stream.done

    got, done = asyncio.run(go())
    assert [c["choices"][0]["delta"]["content"] for c in got] == ["a", "b"]
    assert done
