"""Gateway-key authentication for the async server: ``db.keys.lookup_key`` behind two short caches,
and a throttle on failed keys per client address.

A lookup is a database round trip; doing one per request would cost more than the whole proxy hop,
so results are kept for ``ttl_s`` seconds, keyed by the key's SHA-256 (the plaintext is never kept).
A revoked key therefore stops working within ``ttl_s`` in every process.

Known keys and unknown ones live in separate caches: a client presenting random keys
fills only the negative cache (bounded, cleared when full), never the known-keys cache, so it cannot
evict the keys of running applications. The known-keys cache drops its least recently used entry
when full, which only real keys can make it.

When the database does not answer (a stall, a lock, an outage), a key seen in the last ``stale_s``
seconds (10 minutes) keeps its last known answer, so running applications are not cut off by an
incident in the gateway's own store; a key not seen that recently gets a 503
(``gateway_store_unavailable``), never a 500. The cost: a key revoked during the outage works until
the database answers again (its revocation cannot be read before then).

:class:`FailedKeyThrottle` counts failed keys per client address in a sliding window: past
``max_failures`` in ``window_s`` seconds the address gets 429 with ``Retry-After`` (until its oldest
counted failure leaves the window) without any lookup, so guessing is slow and costs the database
nothing. A key already in the known cache is still served (and looked up again past its TTL) from a
throttled address: a guesser sharing a NAT with an application does not cut the application off.

Keys are compared by their digest: the caches are dicts of digests and the database lookup goes by
the indexed hash and ends with ``hmac.compare_digest`` (``db.keys``), so timing reveals nothing of a
key.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import anyio.to_thread
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.server import wire
from db.keys import KeyRecord, hash_key, lookup_key

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 2.0
DEFAULT_STALE_S = 600.0  # how long a known answer is kept while the database does not answer
MAX_ENTRIES = 10_000  # known keys kept (least recently used dropped first)
MAX_UNKNOWN = 10_000  # unknown digests kept (cleared when full: a flood only ever costs lookups)
DEFAULT_MAX_FAILURES = 20  # failed keys per client address in the window before it is throttled
DEFAULT_FAILURE_WINDOW_S = 60.0
MAX_ADDRESSES = 10_000  # client addresses tracked (the longest quiet dropped first)
THROTTLED = "failed_keys_throttled"


class FailedKeyThrottle:
    """Failed keys per client address in a sliding window (a log of at most ``max_failures``
    timestamps per address). Pure: time is passed in."""

    def __init__(
        self,
        *,
        max_failures: int = DEFAULT_MAX_FAILURES,
        window_s: float = DEFAULT_FAILURE_WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
    ):
        if max_failures < 1 or not window_s > 0 or max_addresses < 1:
            raise ValueError("max_failures and max_addresses must be >= 1, window_s > 0")
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_addresses = max_addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str | None, now: float) -> int | None:
        """Seconds until ``address`` may try a key again, or None when it is not throttled."""
        if address is None:
            return None
        log_ = self._failures.get(address)
        if log_ is None or len(log_) < self.max_failures:
            return None
        wait = log_[0] + self.window_s - now  # the full log's oldest failure leaving the window
        return max(1, math.ceil(wait)) if wait > 0 else None

    def failed(self, address: str | None, now: float) -> None:
        if address is None:
            return
        log_ = self._failures.get(address)
        if log_ is None:
            if len(self._failures) >= self.max_addresses:
                self._failures.popitem(last=False)
            log_ = self._failures[address] = deque(maxlen=self.max_failures)
        else:
            self._failures.move_to_end(address)
        while log_ and log_[0] <= now - self.window_s:
            log_.popleft()
        log_.append(now)

    def __len__(self) -> int:
        return len(self._failures)


class KeyAuthenticator:
    """``await auth(token, client)`` -> the active :class:`KeyRecord` or None; a
    :class:`wire.WireError` 429 when ``client`` (an address) is throttled, 503 when the store is down
    and the key is not known."""

    def __init__(
        self,
        engine: Engine,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        stale_s: float = DEFAULT_STALE_S,
        clock: Callable[[], float] = time.monotonic,
        lookup: Callable[[Engine, str], KeyRecord | None] = lookup_key,
        throttle: FailedKeyThrottle | None = None,
        max_known: int = MAX_ENTRIES,
        max_unknown: int = MAX_UNKNOWN,
    ):
        self.engine = engine
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.clock = clock
        self._lookup = lookup
        self.throttle = throttle if throttle is not None else FailedKeyThrottle()
        self.max_known = max_known
        self.max_unknown = max_unknown
        self._known: OrderedDict[str, tuple[float, KeyRecord]] = OrderedDict()
        self._unknown: dict[str, float] = {}
        self._pending: dict[str, asyncio.Future[KeyRecord | None]] = {}

    async def __call__(self, token: str | None, client: str | None = None) -> KeyRecord | None:
        if not token:
            return None
        digest = hash_key(token)
        now = self.clock()
        hit = self._known.get(digest)
        if hit is not None and now - hit[0] < self.ttl_s:
            self._known.move_to_end(digest)
            return hit[1]
        wait = self.throttle.retry_after(client, now)
        if wait is not None and hit is None:  # a key this process knows is not a guess: looked up
            raise wire.WireError(
                429,
                f"Too many invalid gateway keys from this address; retry in {wait} s. "
                "Fix: use a key from `python -m app keys create`.",
                type="requests",
                code=THROTTLED,
                headers={"Retry-After": str(wait)},
            )
        missed = self._unknown.get(digest)
        if hit is None and missed is not None and now - missed < self.ttl_s:
            self.throttle.failed(client, now)
            return None
        record = await self._shared_lookup(token, digest, now, hit)
        if record is None:
            self.throttle.failed(client, now)
        return record

    async def _shared_lookup(
        self, token: str, digest: str, now: float, hit: tuple[float, KeyRecord] | None
    ) -> KeyRecord | None:
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
                # the one looking it up was (its client left): look again
                return await self._shared_lookup(token, digest, now, hit)
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
        self, token: str, digest: str, now: float, hit: tuple[float, KeyRecord] | None
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
        if record is None:
            self._known.pop(digest, None)  # revoked (or never valid): its old answer must not come back
            if len(self._unknown) >= self.max_unknown:
                self._unknown.clear()
            self._unknown[digest] = now
            return None
        self._unknown.pop(digest, None)
        self._known[digest] = (now, record)
        self._known.move_to_end(digest)
        if len(self._known) > self.max_known:
            self._known.popitem(last=False)
        return record

    @property
    def _cache(self) -> dict:
        """Both caches, for tests that check no plaintext key is kept."""
        return {**self._known, **self._unknown}

    def forget(self) -> None:
        """Drop every cached result (after revoking a key in this process)."""
        self._known.clear()
        self._unknown.clear()
