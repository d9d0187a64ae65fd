"""app.routing.sse against the SDK's own SSE decoder, which it replaces on the server's stream path:
the same events from the same bytes, however the bytes are cut into reads."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from app.routing.sse import SSESplitter

STREAMS = [
    b'data: {"a":1}\n\ndata: {"b":2}\n\n',
    b'data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\n',  # CRLF line ends
    b'data: {"a":1}\r\rdata: {"b":2}\r\r',  # CR line ends
    b": a comment\ndata: x\n\n:keep-alive\n\n",  # comments, and an event of comments only
    b"event: thread.run\ndata: {}\n\n",  # a named event
    b"data: one\ndata: two\n\n",  # data lines joined with LF
    b"data:no-space\n\ndata:  two spaces\n\n",  # one space after the colon dropped, no more
    b"data\n\n",  # a field with no colon: empty data
    b'data: {"a":1}\n\ndata: [DONE]\n\n',
    b"data: last without its blank line",  # ends with the stream
    "data: é ünïcode\n\n".encode(),
]


def sdk_events(data: bytes) -> list[tuple[str | None, str]]:
    async def gen():
        yield data

    async def run() -> list[tuple[str | None, str]]:
        return [(e.event, e.data) async for e in SSEDecoder().aiter_bytes(gen())]

    return asyncio.run(run())


def ours(pieces: list[bytes]) -> list[tuple[str | None, str]]:
    s = SSESplitter()
    out = [e for p in pieces for e in s.feed(p)] + s.end()
    return [(e.event, e.data.decode()) for e in out]


def _comparable(events: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    # The SDK also yields an event for a block of comments only (empty data); no consumer reads it.
    return [(ev, d) for ev, d in events if d or ev]


@pytest.mark.parametrize("data", STREAMS)
def test_the_same_events_as_the_sdk_decoder_in_one_read(data: bytes) -> None:
    assert _comparable(ours([data])) == _comparable(sdk_events(data))


@pytest.mark.parametrize("data", STREAMS)
def test_every_cut_into_two_reads_gives_the_same_events(data: bytes) -> None:
    whole = ours([data])
    for cut in range(len(data) + 1):
        assert ours([data[:cut], data[cut:]]) == whole, cut


@given(st.sampled_from(STREAMS), st.lists(st.integers(min_value=1, max_value=7), max_size=20))
def test_any_cut_into_many_reads_gives_the_same_events(data: bytes, sizes: list[int]) -> None:
    pieces, rest = [], data
    for n in sizes:
        pieces.append(rest[:n])
        rest = rest[n:]
    pieces.append(rest)
    assert ours(pieces) == ours([data])


def test_a_long_unterminated_event_is_searched_once_per_read() -> None:
    s = SSESplitter()
    for _ in range(10_000):
        assert s.feed(b"x" * 100) == []  # data of one event that never ends: nothing yet
    assert len(s.end()) == 0  # no "data" field: no event
