"""The library path's latency: ``RoutingClient.chat`` of this tree (a blocking portal over the async
driver) against a baseline checkout's (``BENCH_PORTAL_BASELINE=/path/to/checkout``, e.g. a
``git worktree`` of the commit before the portal, whose sync client drove the SDK on httpx2).

``python -m benchmarks.driver_portal``: per call of ``chat(model="auto", session_id=...)``,
non-streamed and streamed (read to the end), over loopback HTTP to the zero-latency simulator in
a process of its own and over the in-process simulator (its mock transport). Each side runs in a
fresh process of its own tree, in interleaved rounds (a round: warm-up, then ``PER_ROUND`` calls of
each kind); printed are the p50/p90/p99 of each side over all rounds, the spread of the rounds'
p50s, and the process's CPU per call (every thread's: the portal's loop thread included), which a
loaded machine distorts less than a latency. Without a baseline, this tree alone. Printed, not
asserted; ``--json`` prints the rows as JSON too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.router_bench import REPO, _start_simulator

ROUNDS = int(os.environ.get("BENCH_PORTAL_ROUNDS", "6"))
PER_ROUND = int(os.environ.get("BENCH_PORTAL_PER_ROUND", "200"))
WARMUP = int(os.environ.get("BENCH_PORTAL_WARMUP", "100"))

# One round in a fresh process of a tree (this one or the baseline): only helpers both trees have.
WORKER = r"""
import json, os, sys, tempfile, time
from pathlib import Path
from benchmarks.router_bench import KEYS, MESSAGES, REPO, SESSION, _settings, build_router
from app.simulator import SimulatedProvider, make_transport

mode, url = sys.argv[1], sys.argv[2]
warmup, n = int(sys.argv[3]), int(sys.argv[4])
tmp = Path(tempfile.mkdtemp(prefix="bench-portal-"))
toml = (REPO / "gateway.toml").read_text()
if mode == "loopback":
    for name in ("holysheep", "direct"):
        toml = toml.replace(f'"sim://{name}"', f'"{url}/{name}/v1"')
    router = build_router(_settings(toml, tmp), env=KEYS)
else:
    settings = _settings(toml, tmp)
    transports = {
        name: make_transport(SimulatedProvider(name, p.models, latency_scale=0.0, seed=1))
        for name, p in settings.providers.items()
    }
    router = build_router(settings, transports=transports)

def plain():
    router.chat(MESSAGES, model="auto", session_id=SESSION)

def streamed():
    for _ in router.chat(MESSAGES, model="auto", session_id=SESSION, stream=True):
        pass

out = {}
for kind, fn in (("plain", plain), ("stream", streamed)):
    for _ in range(warmup):
        fn()
    router.flush()
    times = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    cpu = (time.process_time() - cpu0) * 1000 / n
    router.flush()
    out[kind] = {"ms": times, "cpu_ms": cpu}
router.close()
print("RESULT " + json.dumps(out))
"""


def _round(tree: Path, mode: str, url: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, mode, url, str(WARMUP), str(PER_ROUND)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"round in {tree} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def _q(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100)[p - 1]


def main() -> list[dict]:
    trees = {"this tree": REPO}
    baseline = os.environ.get("BENCH_PORTAL_BASELINE")
    if baseline:
        trees["baseline"] = Path(baseline).resolve()
    rows: list[dict] = []
    proc, url = _start_simulator()
    try:
        for mode in ("loopback", "mock"):
            got: dict[str, dict[str, list[dict]]] = {t: {"plain": [], "stream": []} for t in trees}
            for r in range(ROUNDS):
                order = list(trees.items())
                if r % 2:
                    order.reverse()
                for name, tree in order:
                    result = _round(tree, mode, url)
                    for kind in ("plain", "stream"):
                        got[name][kind].append(result[kind])
            for kind in ("plain", "stream"):
                for name in trees:
                    rounds = got[name][kind]
                    ms = sorted(t for rd in rounds for t in rd["ms"])
                    p50s = sorted(statistics.median(rd["ms"]) for rd in rounds)
                    cpu = statistics.median(rd["cpu_ms"] for rd in rounds)
                    row = {
                        "path": "loopback HTTP" if mode == "loopback" else "in-process simulator",
                        "kind": "streamed" if kind == "stream" else "non-streamed",
                        "side": name,
                        "p50_ms": round(statistics.median(ms), 3),
                        "p90_ms": round(_q(ms, 90), 3),
                        "p99_ms": round(_q(ms, 99), 3),
                        "round_p50s_ms": [round(p, 3) for p in p50s],
                        "cpu_ms_per_call": round(cpu, 3),
                        "n": len(ms),
                    }
                    rows.append(row)
                    print(
                        f"{row['path']} {row['kind']}: {name}: p50 {row['p50_ms']:.3f} ms, p90 {row['p90_ms']:.3f}, "
                        f"p99 {row['p99_ms']:.3f}; round p50s {p50s[0]:.3f}-{p50s[-1]:.3f}; "
                        f"CPU {row['cpu_ms_per_call']:.3f} ms/call (n={row['n']})",
                        flush=True,
                    )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


if __name__ == "__main__":
    rows = main()
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
