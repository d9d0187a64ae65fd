"""Gateway-key authentication for the async server: ``db.keys.lookup_key`` behind a short cache.

A lookup is a database round trip; doing one per request would cost more than the whole proxy hop,
so results (hits and misses) are kept for ``ttl_s`` seconds, keyed by the key's SHA-256 (the
plaintext is never kept). A revoked key therefore stops working within ``ttl_s`` in every process.
Misses are cached too, so a client hammering with a wrong key does not hammer the database; the
cache is bounded and cleared when full.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio.to_thread
from sqlalchemy import Engine

from db.keys import KeyRecord, hash_key, lookup_key

DEFAULT_TTL_S = 2.0
MAX_ENTRIES = 10_000


class KeyAuthenticator:
    """``await auth(token)`` -> the active :class:`KeyRecord` or None."""

    def __init__(
        self,
        engine: Engine,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        lookup: Callable[[Engine, str], KeyRecord | None] = lookup_key,
    ):
        self.engine = engine
        self.ttl_s = ttl_s
        self.clock = clock
        self._lookup = lookup
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}

    async def __call__(self, token: str | None) -> KeyRecord | None:
        if not token:
            return None
        digest = hash_key(token)
        now = self.clock()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        # The lookup blocks on the database: run it off the event loop.
        record = await anyio.to_thread.run_sync(self._lookup, self.engine, token)
        if len(self._cache) >= MAX_ENTRIES:
            self._cache.clear()
        self._cache[digest] = (now, record)
        return record

    def forget(self) -> None:
        """Drop every cached result (after revoking a key in this process)."""
        self._cache.clear()
