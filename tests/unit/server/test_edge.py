"""The edge's write coalescing (app.server.edge.CoalescingTransport): a response's head goes out
with the first write after it, in one send; nothing after the head is ever held back (a stream's
first event must not wait for the ones produced after it: that was a 17 ms time-to-first-token
regression when every write of a loop step was batched)."""

from __future__ import annotations

import asyncio

from app.server.edge import CoalescingTransport


class Recorder:
    """A transport that records what is written, each call apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def test_the_head_goes_out_with_the_body_in_one_write_and_later_writes_at_once() -> None:
    async def go() -> None:
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(HEAD)
        assert rec.writes == []  # the head waits for its body
        assert t.get_write_buffer_size() == len(HEAD)
        t.write(b"data: 1\n\n")
        assert rec.writes == [HEAD + b"data: 1\n\n"]
        for i in range(2, 5):  # a stream's events, produced back to back: each one out at once
            t.write(b"data: %d\n\n" % i)
        assert rec.writes[1:] == [b"data: 2\n\n", b"data: 3\n\n", b"data: 4\n\n"]

    asyncio.run(go())


def test_a_head_alone_is_sent_at_the_end_of_the_loop_step_and_before_a_close() -> None:
    async def go() -> None:
        rec = Recorder()
        t = CoalescingTransport(rec, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(HEAD)
        await asyncio.sleep(0)
        assert rec.writes == [HEAD]
        rec2 = Recorder()
        t2 = CoalescingTransport(rec2, asyncio.get_running_loop())  # type: ignore[arg-type]
        t2.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        t2.close()  # a refusal: written, then closed
        assert rec2.writes == [b"HTTP/1.1 408 Request Timeout\r\n\r\n"] and rec2.closed
        await asyncio.sleep(0)
        assert len(rec2.writes) == 1  # the scheduled flush finds nothing left

    asyncio.run(go())
