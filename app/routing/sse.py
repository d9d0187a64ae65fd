"""Server-sent events split out of a byte stream (the WHATWG event-stream rules): events end at a
blank line, lines at CRLF, LF or CR, ``data`` lines join with LF, a comment line starts with ``:``,
one space after the colon is dropped. Data stays bytes: an event is parsed as JSON only where
someone needs it. The common shape, one ``data: ...`` line per event and LF line ends, takes one
``find`` per event."""

from __future__ import annotations

__all__ = ["SSEEvent", "SSESplitter"]


class SSEEvent:
    __slots__ = ("data", "event")

    def __init__(self, data: bytes, event: str | None = None):
        self.data = data
        self.event = event

    def __repr__(self) -> str:
        return f"SSEEvent({self.data!r}, event={self.event!r})"


class SSESplitter:
    """``feed(bytes)`` -> the events completed so far; ``end()`` at the end of the stream."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._cr = False  # the last byte fed was a CR: a LF first in the next piece belongs to it

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if (
            not self._pending
            and chunk[:6] == b"data: "
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1] == 10
            and b"\r" not in chunk
        ):  # the common read, one whole ``data:`` line and its blank line
            self._cr = False
            return [SSEEvent(chunk[6:-2])]
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = chunk[-1:] == b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._pending:
            seen = len(self._pending)
            self._pending += chunk
            if self._pending.find(b"\n\n", max(seen - 1, 0)) < 0:
                return []  # the pending event goes on: only the new bytes were searched
            buf = bytes(self._pending)
            self._pending = bytearray()
        else:
            buf = chunk
        out: list[SSEEvent] = []
        start = 0
        find = buf.find
        while (end := find(b"\n\n", start)) >= 0:
            event = _parse(buf[start:end])
            if event is not None:
                out.append(event)
            start = end + 2
        if start < len(buf):
            self._pending = bytearray(buf[start:])
        return out

    def end(self) -> list[SSEEvent]:
        """At the end of the stream: an event without its closing blank line is not dispatched, as
        the event-stream rules (and the SDK's decoder) say."""
        self._pending = bytearray()
        return []


def _parse(block: bytes) -> SSEEvent | None:
    if block[:6] == b"data: " and b"\n" not in block:
        return SSEEvent(block[6:])
    data: list[bytes] = []
    event: str | None = None
    for line in block.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")
    if not data:
        return None
    return SSEEvent(b"\n".join(data), event)
