"""``python -m benchmarks [NAME ...]``: run the performance budgets, print a table and write
``benchmarks/results.json``. No name runs all suites. Exit status 1 when a budget is missed (budgets
are reported here, never asserted in the test suite).

Suites: router (RoutingClient.chat vs a bare SDK call, interleaved, over the mock transport and over
loopback HTTP), ingest (log writer into SQLite with the shipped settings), monitor (a 24-hour
monitor render over 1,000,000 logged requests, serialisation included), kv (one KV-calculator page
render; ``kvcache`` is accepted as its old name), proxy (the gateway server as a hop beside Portkey's
gateway, LiteLLM's proxy and nginx over an nginx upstream, loaded by wrk: added latency, req/s at 1,
16, 64 and 256 connections, CPU ms/request, added TTFT and stream total, RSS, --workers 2), soak (requests/s
and added latency before, during and after a 30 s database stall, rows lost and duplicated;
``BENCH_SOAK_STALL_S`` shortens it), scale (30 M request-log rows in a PostgreSQL cluster of its own:
each page's data render time, the insert on a fresh database, prune, bytes per million rows;
``BENCH_SCALE_ROWS`` chooses fewer; not part of a run of all suites), prune-sqlite (how long each of
SQLite's prune batches holds the write lock over 5 M rows; by name only too), upstream-clients
(CPU per upstream call of the HTTP clients the server could use, side by side; by name only), rollouts
(the rollout analysis by simulation: false aborts of healthy candidates, regressions caught by 25 %,
beside today's guardrail; by name only). Each row says what was
measured, its n and its spread; the machine is a shared 2-core box, so read medians with their spread.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

# Suites left out of a run that names none: long, or needing nginx and peers' virtualenvs.
LONG = ("scale", "prune-sqlite", "upstream-clients", "streams", "stream-cpu", "stream-path", "stream-floor", "rollouts")
SUITES = {
    "router": "benchmarks.router_bench",
    "ingest": "benchmarks.ingest_bench",
    "monitor": "benchmarks.monitor_bench",
    "kv": "benchmarks.kvcache_bench",
    "proxy": "benchmarks.proxy_bench",
    "soak": "benchmarks.soak_bench",
    "scale": "benchmarks.scale_bench",
    "prune-sqlite": "benchmarks.prune_sqlite_bench",
    "upstream-clients": "benchmarks.upstream_clients_bench",
    "streams": "benchmarks.streams_bench",
    "stream-cpu": "benchmarks.stream_cpu_bench",
    "stream-path": "benchmarks.stream_path_bench",
    "stream-floor": "benchmarks.stream_floor_bench",
    "rollouts": "benchmarks.rollouts_bench",
}
ALIASES = {"kvcache": "kv"}
RESULTS = Path(__file__).parent / "results.json"


def main(argv: list[str]) -> int:
    # The scale suite fills tens of millions of rows (tens of minutes): run it by name only.
    chosen = [ALIASES.get(n, n) for n in argv] or [
        n
        for n in SUITES
        if n
        not in (
            "scale",
            "prune-sqlite",
            "upstream-clients",
            "streams",
            "stream-cpu",
            "stream-path",
            "stream-floor",
            "rollouts",
        )
    ]
    unknown = [n for n in chosen if n not in SUITES]
    if unknown:
        print(f"unknown suite(s): {', '.join(unknown)}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    rows: list[dict] = []
    for name in chosen:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        for row in importlib.import_module(SUITES[name]).run():
            rows.append({"suite": name, **row})
        print(f"  {name} done in {time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    width = max(len(r["name"]) for r in rows)
    print(f"{'suite':<8} {'measure':<{width}} {'value':>12} {'unit':<6} {'budget':>8}  {'met':<6} {'n':>6}  spread")
    for r in rows:
        budget = "" if r.get("budget") is None else f"{r['budget']:g}"
        met = "" if r.get("budget") is None else ("yes" if r["ok"] else "MISSED")
        value = "n/a" if r["value"] is None else f"{r['value']:g}"
        print(
            f"{r['suite']:<8} {r['name']:<{width}} {value:>12} {r['unit']:<6} {budget:>8}  {met:<6} "
            f"{r.get('n', ''):>6}  {r.get('spread', '') or r.get('note', '')}"
        )
    print("\nwhat was measured:")
    for r in rows:
        if r.get("measured"):
            print(f"  {r['suite']}: {r['name']}: {r['measured']}")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # Running one suite keeps the other suites' last figures (each row says when it was measured).
    kept = []
    if RESULTS.exists():
        try:
            kept = [r for r in json.loads(RESULTS.read_text()).get("results", []) if r.get("suite") not in chosen]
        except (ValueError, AttributeError):
            kept = []
    RESULTS.write_text(
        json.dumps(
            {
                "measured_at": stamp,
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "note": "shared 2-core development machine, other jobs running: noisy; read medians with spread",
                },
                "results": kept + [{**r, "measured_at": stamp} for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
