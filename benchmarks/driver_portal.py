"""Which way the two drivers should share one loop: the sync driver as it is (the SDK on httpx2)
or a blocking portal over the async driver (a private event loop in a thread; each call is
``run_coroutine_threadsafe(async_driver.chat(...)).result()``).

``python -m benchmarks.driver_portal``: per-call latency of ``chat(model="auto", session_id=...)``
on the library path, both ways, interleaved rounds, non-streamed and streamed (read to the end),
over loopback HTTP to the zero-latency simulator in its own process and over the in-process mock
transport. Printed, not asserted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path

from app.routing.io.async_client import AsyncRoutingClient
from app.simulator import SimulatedProvider, make_transport
from benchmarks.router_bench import KEYS, MESSAGES, REPO, SESSION, _settings, _start_simulator, build_router

ROUNDS = int(os.environ.get("BENCH_PORTAL_ROUNDS", "20"))
PER_ROUND = int(os.environ.get("BENCH_PORTAL_PER_ROUND", "100"))


class Portal:
    """A private event loop in a daemon thread; ``call(coro)`` blocks until it is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


async def _drain(stream) -> None:
    async for _ in stream:
        pass


def _compare(label: str, router, portal: Portal, driver: AsyncRoutingClient, stream: bool = False) -> None:
    import time

    def sync_call() -> None:
        if stream:
            for _ in router.chat(MESSAGES, model="auto", session_id=SESSION, stream=True):
                pass
        else:
            router.chat(MESSAGES, model="auto", session_id=SESSION)

    def portal_call() -> None:
        if stream:
            portal.call(_drain(driver.chat_stream(MESSAGES, model="auto", session_id=SESSION)))
        else:
            portal.call(driver.chat(MESSAGES, model="auto", session_id=SESSION))

    for fn in (sync_call, portal_call):
        for _ in range(200):
            fn()
    times: dict[str, list[float]] = {"sync driver": [], "portal over async": []}
    for r in range(ROUNDS):
        order = [("sync driver", sync_call), ("portal over async", portal_call)]
        if r % 2:
            order.reverse()
        for name, fn in order:
            for _ in range(PER_ROUND):
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1000)
        router.flush()
    for name, ts in times.items():
        ts.sort()
        q = statistics.quantiles(ts, n=100)
        kind = f"{label}{' streamed' if stream else ''}"
        print(f"{kind}: {name}: p50 {statistics.median(ts):.3f} ms, p90 {q[89]:.3f}, p99 {q[98]:.3f} (n={len(ts)})")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        # loopback HTTP: the sync driver's SDK on httpx2 vs the async driver's pyreqwest client
        proc, url = _start_simulator()
        try:
            toml = (REPO / "gateway.toml").read_text()
            for name in ("holysheep", "direct"):
                toml = toml.replace(f'"sim://{name}"', f'"{url}/{name}/v1"')
            router = build_router(_settings(toml, tmp), env=KEYS)
            portal = Portal()
            driver = portal.call(_make(router))
            try:
                _compare("loopback HTTP", router, portal, driver)
                _compare("loopback HTTP", router, portal, driver, stream=True)
            finally:
                portal.call(driver.aclose())
                portal.close()
                router.close()
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        # in-process mock transport (the simulator): the async driver reaches it through a worker thread
        settings = _settings((REPO / "gateway.toml").read_text(), tmp)
        transports = {
            n: make_transport(SimulatedProvider(n, p.models, latency_scale=0.0, seed=1))
            for n, p in settings.providers.items()
        }
        router = build_router(settings, transports=transports)
        portal = Portal()
        driver = portal.call(_make(router))
        try:
            _compare("mock transport", router, portal, driver)
            _compare("mock transport", router, portal, driver, stream=True)
        finally:
            portal.call(driver.aclose())
            portal.close()
            router.close()


async def _make(router) -> AsyncRoutingClient:
    return AsyncRoutingClient(router)


if __name__ == "__main__":
    main()
