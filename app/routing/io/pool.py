"""Per-provider connection slots for the async driver: saturation is the gateway's own state.

Each provider has ``[providers.NAME] max_connections`` slots (its upstream connections at once in
this process; the HTTP client's own pool is sized to match, so it never queues behind this). An
attempt takes a slot before it sends and gives it back when its answer is read or its stream
closed. When every slot is taken the attempt waits, at most ``pool_timeout_s`` (and never past the
request's deadline); when the wait runs out it fails with :class:`PoolSaturated`, which the
classifier turns into ``gateway_overloaded``: no retry, no fallback, nothing told to the
provider's circuit breaker, and the caller gets 503 with ``Retry-After``. A wait for a slot is the
gateway's own saturation, so it must never run down the attempt's deadline and count as the
upstream timing out (which would open the breakers of healthy upstreams under load).

The figures (:attr:`ProviderPool.in_use`, :attr:`waiting`, :attr:`limit`, :attr:`exhausted`)
are read by the server's ``/metrics`` at each scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from core.errors import GatewayError


class PoolSaturated(GatewayError):
    """Every connection slot of a provider stayed taken for the whole allowed wait."""

    def __init__(self, provider: str, limit: int, waited_s: float):
        super().__init__(
            f"all {limit:,} upstream connections to {provider} stayed busy for {waited_s:.2f} s "
            f"(providers.{provider}.max_connections, pool_timeout_s)"
        )
        self.provider = provider
        self.limit = limit
        self.retry_after_s = max(1, math.ceil(waited_s))


class ProviderPool:
    """``async with pool.slot(max_wait_s):`` one upstream connection's worth of this provider."""

    def __init__(self, provider: str, limit: int, timeout_s: float):
        self.provider = provider
        self.limit = limit
        self.timeout_s = timeout_s
        self.in_use = 0
        self.waiting = 0
        self.exhausted = 0  # waits that ran out (each one a 503 to its caller)
        # Waiters in arrival order; a released slot is handed to the first still waiting (FIFO,
        # so a burst cannot starve an early waiter), without in_use ever dropping in between.
        self._waiters: deque[asyncio.Future[None]] = deque()

    @asynccontextmanager
    async def slot(self, max_wait_s: float | None = None) -> AsyncIterator[None]:
        await self.acquire(max_wait_s)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, max_wait_s: float | None = None) -> None:
        """Take a slot, waiting at most ``pool_timeout_s`` (or ``max_wait_s`` when shorter)."""
        if self.in_use < self.limit and not self._waiters:
            self.in_use += 1  # a free slot: taken at once, no timer, no await
            return
        wait = self.timeout_s if max_wait_s is None else max(0.0, min(self.timeout_s, max_wait_s))
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        self.waiting += 1
        try:
            async with asyncio.timeout(wait):
                await granted
        except BaseException as exc:
            if granted.done() and not granted.cancelled():
                self.release()  # handed a slot just as the wait ended: pass it on
            else:
                granted.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(granted)
            if isinstance(exc, TimeoutError):
                self.exhausted += 1
                raise PoolSaturated(self.provider, self.limit, wait) from None
            raise
        finally:
            self.waiting -= 1
        # in_use was kept for this waiter by release()

    def release(self) -> None:
        while self._waiters:
            granted = self._waiters.popleft()
            if not granted.done():
                granted.set_result(None)  # the slot goes straight to the first waiter
                return
        self.in_use -= 1
