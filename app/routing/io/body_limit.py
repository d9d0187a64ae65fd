"""A bound on how much an upstream may send for one attempt.

An upstream (or something pretending to be one) can answer with a body of any size: a 5 GB "chat
completion", or a stream that never stops sending. Without a bound the gateway buffers a
non-streamed body whole and keeps a stream's text for its result, so one such answer could take the
process's memory, and every request in it, down. One counting rule (:class:`Budget`) is applied by
the one reader of upstream bodies (:mod:`app.routing.io.upstream_http`, for the network and for
transports alike), to decoded bytes:

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

from collections.abc import Mapping

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
    """One response's bytes counted against the limit as they arrive."""

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
