"""Saturation is the gateway's own state (issue 18, item 2): a provider's connection slots
(``max_connections``) bound its upstream connections; a wait for one is bounded
(``pool_timeout_s``) and, when it runs out, the request gets 503 ``gateway_overloaded`` with
``Retry-After``, never a breaker failure. Against a real loopback upstream that streams slowly and
counts the connections it holds at once."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.server.metrics import GatewayMetrics


def test_pool_figures_in_the_metrics():
    m = GatewayMetrics(providers=["one"])
    m.set_pool("one", in_use=3, waiting=2, limit=3, exhausted=5)
    m.set_pool("one", in_use=1, waiting=0, limit=3, exhausted=7)
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.exposition().decode())
        for s in fam.samples
        if s.name.startswith("gateway_upstream_pool")
    }
    assert got[("gateway_upstream_pool_connections", (("gen_ai_system", "one"), ("state", "in_use")))] == 1
    assert got[("gateway_upstream_pool_connections", (("gen_ai_system", "one"), ("state", "limit")))] == 3
    assert got[("gateway_upstream_pool_exhausted_total", (("gen_ai_system", "one"),))] == 7


def test_slots_go_to_waiters_first_come_first_served_and_a_cancelled_grant_is_passed_on():
    from app.routing.io.pool import PoolSaturated, ProviderPool

    async def go() -> None:
        pool = ProviderPool("p", limit=2, timeout_s=5)
        await pool.acquire()
        await pool.acquire()
        assert pool.in_use == 2
        order: list[str] = []

        async def wait(name: str) -> None:
            await pool.acquire()
            order.append(name)

        first = asyncio.ensure_future(wait("first"))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(wait("second"))
        third = asyncio.ensure_future(wait("third"))
        await asyncio.sleep(0)
        assert pool.waiting == 3
        pool.release()  # handed straight to the first waiter: in_use never dips
        assert pool.in_use == 2
        second.cancel()  # cancelled while waiting: it holds nothing
        await asyncio.sleep(0)
        pool.release()  # second is gone: third gets it
        await asyncio.gather(first, third)
        assert order == ["first", "third"] and pool.in_use == 2 and pool.waiting == 0
        # A grant whose waiter is cancelled before it resumes is passed to the next one.
        late = asyncio.ensure_future(pool.acquire())
        after = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        pool.release()
        late.cancel()
        await asyncio.sleep(0)
        await after
        assert pool.in_use == 2
        # A wait that runs out is PoolSaturated, counted, and takes nothing.
        with pytest.raises(PoolSaturated):
            await pool.acquire(max_wait_s=0.05)
        assert pool.exhausted == 1 and pool.in_use == 2 and pool.waiting == 0
        pool.release()
        pool.release()
        assert pool.in_use == 0
        await pool.acquire()  # free again: taken at once
        assert pool.in_use == 1

    asyncio.run(go())
