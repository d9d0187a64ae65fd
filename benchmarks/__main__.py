"""``python -m benchmarks [NAME ...]``: run the performance budgets, print a table and write
``benchmarks/results.json``. Exit status 1 when a budget is missed.

Suites: router (RoutingClient overhead vs a bare SDK call), ingest (log writer into SQLite),
monitor (a 24-hour monitor render over 1,000,000 logged requests), kvcache (one calculator render).
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from pathlib import Path

SUITES = {
    "router": "benchmarks.router_bench",
    "ingest": "benchmarks.ingest_bench",
    "kvcache": "benchmarks.kvcache_bench",
    "monitor": "benchmarks.monitor_bench",
}
RESULTS = Path(__file__).parent / "results.json"


def main(argv: list[str]) -> int:
    chosen = argv or list(SUITES)
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
    print(f"{'suite':<8} {'measure':<{width}} {'value':>12} {'unit':<6} {'budget':>10}  ok")
    for r in rows:
        budget = "" if r.get("budget") is None else f"{r['budget']:g}"
        print(
            f"{r['suite']:<8} {r['name']:<{width}} {r['value']:>12g} {r['unit']:<6} {budget:>10}  "
            f"{'yes' if r['ok'] else 'NO'}"
        )
    RESULTS.write_text(
        json.dumps(
            {
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
