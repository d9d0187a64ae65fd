"""SQLite's prune in batches (issue 18, item 10): how long each batch holds the write lock.

``BENCH_PRUNE_SQLITE_ROWS`` rows (default 5,000,000: the issue measured one 46.7 s DELETE holding
the lock for that many) are written with a recursive-CTE ``INSERT ... SELECT`` into a fresh SQLite
file migrated by the gateway's migrations, spread over two days; ``prune`` then removes the older
day. Every batch is its own transaction, so the lock is held for one batch at a time: reported are
the longest batch, the median batch, the number of batches and the whole prune's wall time.

    BENCH_PRUNE_SQLITE_ROWS=1000000 python -m benchmarks prune-sqlite
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from benchmarks.harness import row, say

ROWS = int(os.environ.get("BENCH_PRUNE_SQLITE_ROWS", "5000000"))
DAY_S = 86_400


def run() -> list[dict]:
    from db.engine import dispose_all, get_engine
    from db.requests import prune

    with tempfile.TemporaryDirectory(prefix="gw-prune-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'gateway.db'}"
        engine = get_engine(url)
        start = float(int(time.time()) // DAY_S * DAY_S - 2 * DAY_S)
        gap = 2 * DAY_S / ROWS
        say(f"  prune-sqlite: filling {ROWS:,} rows over two days")
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(
                text(f"""
                WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS - 1})
                INSERT INTO request_log (request_id, attempt, ts, provider, model, requested_model, intent, side,
                    status, latency_ms, prompt_tokens, cached_tokens, completion_tokens, cost_usd, fallback, final,
                    substituted, stream, source, session_id, api, tool_calls, reasoning_tokens)
                SELECT 'b' || i, 1, {start} + i * {gap}, 'holysheep', 'gpt-4.1', 'auto', 'general', 'primary',
                    CASE WHEN i % 20 = 0 THEN 'error' ELSE 'ok' END, 50 + i % 3000, 100, 0, 20, 0.001, 0, 1,
                    i % 50 = 0, 0, 'api', 's' || (i % 100000), 'chat', 0, 0
                FROM n
                """)
            )
        fill_s = time.perf_counter() - t0
        marks: list[float] = []

        def clock() -> float:
            marks.append(time.perf_counter())
            return marks[-1]

        t0 = time.perf_counter()
        out = prune(engine, raw_before=start + DAY_S, clock=clock)
        total_s = time.perf_counter() - t0
        # delete_before reads the clock at each batch's start and end.
        batches = [(marks[i + 1] - marks[i]) * 1000.0 for i in range(0, len(marks) - 1, 2)]
        dispose_all()
    what = f"{ROWS:,} rows ({fill_s:.0f} s to fill), prune of the older day: {out['request_log']:,} rows deleted"
    return [
        row("prune: longest batch (write lock held)", max(batches), "ms", n=len(batches), measured=what, digits=1),
        row(
            "prune: median batch",
            statistics.median(batches),
            "ms",
            n=len(batches),
            spread=f"min {min(batches):.1f}",
            measured=what,
            digits=1,
        ),
        row("prune: whole prune, wall time", total_s, "s", n=1, measured=f"{what} in {len(batches)} batches", digits=1),
    ]
