"""Request ids as ``uuid4().hex`` spells them (32 hex digits), without a ``urandom`` call each: 64
random bits per source, then a counter. Unique across processes as long as each process has its
own source (a forked child calls :meth:`IdSource.reset`)."""

from __future__ import annotations

import itertools
import os


class IdSource:
    """``ids()`` -> the next id."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.prefix = os.urandom(8).hex()
        self._count = itertools.count(1)

    def __call__(self) -> str:
        return f"{self.prefix}{next(self._count):016x}"
