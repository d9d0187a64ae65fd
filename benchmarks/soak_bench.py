"""Database-stall soak: requests/s and added latency before, during and after a database stall,
and whether every answered request was logged exactly once.

Measured: ``THREADS`` threads send ``chat()`` requests through one gateway (built with the shipped
settings from gateway.toml, the simulator answering instantly so the gateway's own overhead is
what is timed) into a fresh SQLite file, for ``PHASE_S`` seconds, then for ``STALL_S`` seconds
while a second connection holds ``BEGIN EXCLUSIVE`` on the file (no write can commit), then for
``PHASE_S`` seconds after it is released. Reported: requests/s per phase, the during/before ratio
(budget: at least 0.8), p99 latency added during the stall (p99 during minus p99 before), and,
after the writer has drained and replayed its journal, rows lost and duplicate rows (both must be
0). Environment: ``BENCH_SOAK_STALL_S`` (default 30), ``BENCH_SOAK_PHASE_S`` (default 10),
``BENCH_SOAK_THREADS`` (default 4).

Memory: ``MEMORY_REQUESTS`` more requests (``BENCH_SOAK_MEMORY_REQUESTS``, default 10,000) through
a fresh gateway under ``tracemalloc``, with the faults of the shipped config plus 10 % errors and 5 %
rate limits on both providers (retries, fallbacks, breakers) and the canary ratio changed every
second; reported: the traced memory after the writer has drained, minus that after the first
1,000 requests (budget: under 10 MB, so under about 1 KB a request at the default).
"""

from __future__ import annotations

import gc
import os
import random
import sqlite3
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from app.config import load_settings
from app.gateway import build_gateway
from benchmarks.harness import row, say

STALL_S = float(os.environ.get("BENCH_SOAK_STALL_S", "30"))
PHASE_S = float(os.environ.get("BENCH_SOAK_PHASE_S", "10"))
THREADS = int(os.environ.get("BENCH_SOAK_THREADS", "4"))
REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "Summarise the incident timeline in two sentences."}]
DRAIN_S = 300.0
MEMORY_REQUESTS = int(os.environ.get("BENCH_SOAK_MEMORY_REQUESTS", "10000"))
MEMORY_WARMUP = 1_000
MEMORY_BUDGET_MB = 10.0
_FAULTS = "\n[providers.{name}.faults]\nerror_rate = 0.10\nrate_limit_rate = 0.05\nretry_after_s = 0.0\n"


def faulty_toml(extra: str = "") -> str:
    """The shipped configuration with 10 % errors and 5 % rate limits on both providers, then ``extra``."""
    toml = (REPO / "gateway.toml").read_text()
    toml = toml.replace("[providers.direct]", _FAULTS.format(name="holysheep") + "\n[providers.direct]")
    return toml + _FAULTS.format(name="direct") + extra


def faulty_run(gw, requests: int, threads: int, done, *, bound_s: float = DRAIN_S) -> bool:
    """``requests`` chat() calls (``model="auto"``, 50 sessions) on ``threads`` threads while the
    canary ratio changes every second; ``done(i, result)`` is called after each, ``result`` None when
    the gateway refused it. True when every thread finished within ``bound_s``."""
    from core.errors import GatewayError
    from db.canary import set_ratio

    lock = threading.Lock()
    next_i = [0]
    stop_churn = threading.Event()

    def worker() -> None:
        rng = random.Random(threading.get_ident())
        while True:
            with lock:
                i = next_i[0]
                if i >= requests:
                    return
                next_i[0] += 1
            try:
                r = gw.client.chat(
                    [{"role": "user", "content": f"request {i}"}], model="auto", session_id=f"s{rng.randrange(50)}"
                )
            except GatewayError:
                r = None
            done(i, r)

    def churn() -> None:
        rng = random.Random(5)
        while not stop_churn.wait(1.0):
            set_ratio(gw.engine, round(rng.random(), 2), expected_version=None, actor="soak", reason="churn")

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join(bound_s)
    finally:
        stop_churn.set()
        churner.join(10)
    return not any(t.is_alive() for t in pool)


def _p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def soak(stall_s: float = STALL_S, phase_s: float = PHASE_S, threads: int = THREADS) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    db = tmp / "soak.db"
    settings = load_settings(REPO / "gateway.toml", env={"DATABASE_URL": f"sqlite:///{db}"})
    settings = settings.model_copy(update={"simulator": settings.simulator.model_copy(update={"latency_scale": 0.0})})
    gw = build_gateway(settings, source="loadgen", guardrail=False)
    phase = ["before"]
    samples: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    served: list[str] = []
    failed = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = gw.client.chat(MESSAGES, model="auto")
            except Exception:  # noqa: BLE001 - counted, the soak goes on
                with lock:
                    failed[0] += 1
                continue
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                samples[phase[0]].append(ms)
                served.append(r.request_id)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    spans: dict[str, float] = {}
    for t in pool:
        t.start()
    try:
        t0 = time.perf_counter()
        time.sleep(phase_s)
        locker = sqlite3.connect(db, isolation_level=None, timeout=60)
        locker.execute("BEGIN EXCLUSIVE")
        with lock:
            phase[0] = "during"
        t1 = time.perf_counter()
        spans["before"] = t1 - t0
        time.sleep(stall_s)
        stats_in_stall = gw.telemetry.stats()
        with lock:
            phase[0] = "after"
        locker.execute("ROLLBACK")
        locker.close()
        t2 = time.perf_counter()
        spans["during"] = t2 - t1
        time.sleep(phase_s)
        with lock:
            phase[0] = "done"  # requests finishing now belong to no phase
            samples["done"] = []
        spans["after"] = time.perf_counter() - t2
    finally:
        stop.set()
        for t in pool:
            t.join(60)
    drained = gw.telemetry.drain(DRAIN_S)
    stats = gw.telemetry.stats()
    with gw.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT request_id, attempt, final FROM request_log").fetchall()
    gw.close()
    finals = {r[0] for r in rows if r[2]}
    pairs = {(r[0], r[1]) for r in rows}
    return {
        "rps": {k: len(samples[k]) / spans[k] for k in ("before", "during", "after")},
        "p50": {k: _p(samples[k], 0.5) for k in ("before", "during", "after")},
        "p99": {k: _p(samples[k], 0.99) for k in ("before", "during", "after")},
        "n": {k: len(samples[k]) for k in ("before", "during", "after")},
        "served": len(served),
        "lost": sum(1 for i in served if i not in finals),
        "duplicates": len(rows) - len(pairs),
        "failed_requests": failed[0],
        "drained": drained,
        "spilled_in_stall": stats_in_stall.spilled,
        "stats": stats.to_dict(),
        "queue_size": settings.telemetry.queue_size,
    }


def memory_growth(requests: int = MEMORY_REQUESTS, threads: int = THREADS) -> dict:
    """Traced memory from after the warm-up to the end of a faulty run with canary churn."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-mem-"))
    (tmp / "gateway.toml").write_text(faulty_toml("\n[simulator]\nlatency_scale = 0\nseed = 11\n"))
    settings = load_settings(tmp / "gateway.toml", env={"DATABASE_URL": f"sqlite:///{tmp / 'mem.db'}"})
    gw = build_gateway(settings, source="loadgen", guardrail=False, sleep=lambda _s: None)
    after_warmup = [0]

    def done(i: int, _result) -> None:
        if i == MEMORY_WARMUP:  # sampled in the worker that made it; the others go on
            gc.collect()
            after_warmup[0] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        finished = faulty_run(gw, requests, threads, done)
        drained = gw.telemetry.drain(DRAIN_S)
        gc.collect()
        at_end, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gw.close()
    return {
        "growth_mb": (at_end - after_warmup[0]) / 1e6,
        "peak_mb": peak / 1e6,
        "requests": requests,
        "drained": drained and finished,
        "seconds": time.perf_counter() - t0,
    }


def run() -> list[dict]:
    what = (
        f"{THREADS} threads of chat() through one gateway (shipped settings, instant simulator, fresh SQLite file): "
        f"{PHASE_S:g} s before, {STALL_S:g} s with BEGIN EXCLUSIVE held by another connection, {PHASE_S:g} s after; "
        "then the writer drains and replays its journal and the log is compared with the answered requests"
    )
    say(f"  soak: {what}")
    r = soak()
    say(
        f"  soak: served {r['served']:,} ({r['failed_requests']} failed), spilled {r['spilled_in_stall']:,} during "
        f"the stall (queue {r['queue_size']:,}), drained={r['drained']}, writer {r['stats']}"
    )
    spread = ", ".join(f"{k} n={r['n'][k]:,} p50 {r['p50'][k]:.2f} ms p99 {r['p99'][k]:.2f} ms" for k in r["n"])
    ratio = r["rps"]["during"] / r["rps"]["before"] if r["rps"]["before"] else 0.0
    return [
        row("requests/s before the stall", r["rps"]["before"], "req/s", n=r["n"]["before"], measured=what, digits=1),
        row("requests/s during the stall", r["rps"]["during"], "req/s", n=r["n"]["during"], digits=1),
        row("requests/s after the stall", r["rps"]["after"], "req/s", n=r["n"]["after"], digits=1),
        row(
            "throughput during / before the stall",
            ratio,
            "ratio",
            budget=0.8,
            lower_is_better=False,
            spread=spread,
            digits=3,
        ),
        row("p99 added latency during the stall", r["p99"]["during"] - r["p99"]["before"], "ms", digits=3),
        row("rows lost (answered, not logged)", r["lost"], "rows", budget=1, n=r["served"], digits=0),
        row("duplicate rows", r["duplicates"], "rows", budget=1, digits=0),
        *_memory_rows(),
    ]


def _memory_rows() -> list[dict]:
    what = (
        f"{MEMORY_REQUESTS:,} chat() requests on {THREADS} threads through a fresh gateway under tracemalloc, "
        "10 % errors and 5 % rate limits on both providers, the canary ratio changed every second; traced memory "
        f"after the writer drained minus after the first {MEMORY_WARMUP:,} requests"
    )
    say(f"  soak: {what}")
    m = memory_growth()
    say(f"  soak: memory {m}")
    return [
        row(
            "memory growth after warm-up",
            m["growth_mb"],
            "MB",
            budget=MEMORY_BUDGET_MB,
            n=m["requests"],
            spread=f"peak traced {m['peak_mb']:.1f} MB, drained={m['drained']}, {m['seconds']:.0f} s",
            measured=what,
            digits=2,
        )
    ]


if __name__ == "__main__":
    for item in run():
        print(item)
