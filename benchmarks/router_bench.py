"""Router overhead: ``RoutingClient.chat`` against a zero-latency simulator vs a bare openai SDK
call through the same transport. Budget: at most 1.15x and at most 0.3 ms added at p50.

Both sides run the same SDK request through the same simulator; the difference is what the router
adds (validation, intent rules, canary lookup, attempt record, cost, telemetry hand-off). Samples
are interleaved so drift in machine load hits both sides alike.
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from pathlib import Path

import httpx2
import openai

from app.config import load_settings
from app.routing import RoutingClient
from app.simulator import SimulatedProvider, make_transport

N = 3000
WARMUP = 300


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    settings = load_settings("gateway.toml", env={"DATABASE_URL": f"sqlite:///{tmp / 'b.db'}"})
    settings = settings.model_copy(
        update={"simulator": settings.simulator.model_copy(update={"latency_scale": 0.0, "seed": 1})}
    )
    sim = SimulatedProvider("direct", settings.providers["direct"].models, latency_scale=0.0, seed=1)
    transport = make_transport(sim)
    router = RoutingClient(settings, transports={"direct": transport, "holysheep": transport})
    bare = openai.OpenAI(
        api_key="sim", base_url="http://direct.sim/v1", max_retries=0, http_client=httpx2.Client(transport=transport)
    )
    msgs = [{"role": "user", "content": "Summarise the benefits of a canary rollout."}]

    def call_router() -> None:
        router.chat(msgs, model="gpt-4.1", route="fallback")

    def call_bare() -> None:
        bare.chat.completions.create(model="gpt-4.1", messages=msgs)

    for _ in range(WARMUP):
        call_router()
        call_bare()
    router.flush()
    r_times: list[float] = []
    b_times: list[float] = []
    gc.collect()
    for _ in range(N):
        t0 = time.perf_counter()
        call_bare()
        t1 = time.perf_counter()
        call_router()
        t2 = time.perf_counter()
        b_times.append((t1 - t0) * 1000)
        r_times.append((t2 - t1) * 1000)
    router.close()
    bare.close()
    b50, r50 = statistics.median(b_times), statistics.median(r_times)
    b99, r99 = _quantile(b_times, 0.99), _quantile(r_times, 0.99)
    ratio = r50 / b50
    added = r50 - b50
    return [
        {"name": "router p50 (ms)", "value": round(r50, 4), "unit": "ms", "budget": None, "ok": True},
        {"name": "bare SDK p50 (ms)", "value": round(b50, 4), "unit": "ms", "budget": None, "ok": True},
        {"name": "router p99 (ms)", "value": round(r99, 4), "unit": "ms", "budget": None, "ok": True},
        {"name": "bare SDK p99 (ms)", "value": round(b99, 4), "unit": "ms", "budget": None, "ok": True},
        {"name": "router/bare p50 ratio", "value": round(ratio, 4), "unit": "x", "budget": 1.15, "ok": ratio <= 1.15},
        {"name": "router added at p50", "value": round(added, 4), "unit": "ms", "budget": 0.3, "ok": added <= 0.3},
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
