"""Gateway-key authentication for the async server: ``db.keys.lookup_key`` behind a short cache.

A lookup is a database round trip; doing one per request would cost more than the whole proxy hop,
so results (hits and misses) are kept for ``ttl_s`` seconds, keyed by the key's SHA-256 (the
plaintext is never kept). A revoked key therefore stops working within ``ttl_s`` in every process.
Misses are cached too, so a client hammering with a wrong key does not hammer the database; the
cache is bounded and cleared when full.

When the database does not answer (a stall, a lock, an outage), a key seen in the last ``stale_s``
seconds (10 minutes) keeps its last known answer, so running applications are not cut off by an
incident in the gateway's own store; a key not seen that recently gets a 503
(``gateway_store_unavailable``), never a 500. The cost: a key revoked during the outage works until
the database answers again (its revocation cannot be read before then).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import anyio.to_thread
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.server import wire
from db.keys import KeyRecord, hash_key, lookup_key

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 2.0
DEFAULT_STALE_S = 600.0  # how long a known answer is kept while the database does not answer
MAX_ENTRIES = 10_000


class KeyAuthenticator:
    """``await auth(token)`` -> the active :class:`KeyRecord` or None."""

    def __init__(
        self,
        engine: Engine,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        stale_s: float = DEFAULT_STALE_S,
        clock: Callable[[], float] = time.monotonic,
        lookup: Callable[[Engine, str], KeyRecord | None] = lookup_key,
    ):
        self.engine = engine
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.clock = clock
        self._lookup = lookup
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}
        self._pending: dict[str, asyncio.Future[KeyRecord | None]] = {}

    async def __call__(self, token: str | None) -> KeyRecord | None:
        if not token:
            return None
        digest = hash_key(token)
        now = self.clock()
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        # One lookup per key at a time: when an entry expires under load, every request holding
        # that key would otherwise query the database at once (a herd every ttl_s); they share
        # the one lookup's answer, or its error, instead.
        pending = self._pending.get(digest)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # this request was cancelled
                return await self(token)  # the one looking it up was (its client left): look again
        pending = asyncio.get_running_loop().create_future()
        self._pending[digest] = pending
        try:
            record = await self._refresh(token, digest, now, hit)
        except BaseException as exc:
            if isinstance(exc, Exception):
                pending.set_exception(exc)
                pending.exception()  # retrieved: no "never retrieved" warning when nobody waited
            else:
                pending.cancel()
            raise
        else:
            pending.set_result(record)
        finally:
            self._pending.pop(digest, None)
        return record

    async def _refresh(
        self, token: str, digest: str, now: float, hit: tuple[float, KeyRecord | None] | None
    ) -> KeyRecord | None:
        # The lookup blocks on the database: run it off the event loop.
        try:
            record = await anyio.to_thread.run_sync(self._lookup, self.engine, token)
        except SQLAlchemyError as exc:
            if hit is not None and now - hit[0] < self.stale_s:
                log.warning(
                    "key store not answering (%s): using the answer from %.0f s ago", type(exc).__name__, now - hit[0]
                )
                return hit[1]
            log.warning("key store not answering (%s): key refused with 503", type(exc).__name__)
            raise wire.store_unavailable("gateway keys cannot be checked") from None
        if len(self._cache) >= MAX_ENTRIES:
            self._cache.clear()
        self._cache[digest] = (now, record)
        return record

    def forget(self) -> None:
        """Drop every cached result (after revoking a key in this process)."""
        self._cache.clear()
