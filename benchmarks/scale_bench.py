"""The log at the source's scale (issue 18, item 10): ``BENCH_SCALE_ROWS`` request-log rows
(default 30,000,000; 420 req/s is about 36 M a day) in a PostgreSQL cluster of the benchmark's own,
then each dashboard page's data render time, the insert's first batch on the fresh (never
analysed) database, prune time and bytes per million rows.

Setup: ``initdb`` into a temporary directory as the ``postgres`` user, started on a free port on
127.0.0.1 (``fsync=off``: a throwaway cluster; the fill is what it speeds up, the measured reads
are served from memory either way; autovacuum off, so the insert is measured on a database whose
log has no statistics, as right after a bulk load). The schema is made by the gateway's own
migrations (``request_log`` partitioned by day), the rows by ``INSERT ... SELECT FROM
generate_series`` straight into the partitions, spread evenly over the two UTC days before the
measured ``now`` (so one whole day partition can be dropped), 100,000 sessions, 5 % failed, 2 %
substituted. The rollups are generated in SQL too, one row per (minute, provider, model, intent,
source, side) over the same span with the counts the log implies, so the Monitor reads the number
of rollup rows a real day produces (its values are not the log's sums to the request: that is
what the unit tests check; here only the volume matters).

Measured (medians of ``RUNS`` runs, through ``app``/``db`` functions, no Streamlit): the Monitor
render (:func:`benchmarks.monitor_bench.render`: monitor_view 24 h + chart JSON + table page), the
Overview (:func:`benchmarks.monitor_bench.render_overview`), the request drill-down (one request's
story and a session search, :func:`benchmarks.monitor_bench.render_request`), the Canary page; one
500-row ``insert_batch`` before any ANALYZE; ``prune`` dropping the older day through an engine
with the CLI's 30 s statement timeout; ``pg_total_relation_size`` of the log per million rows.

    BENCH_SCALE_ROWS=3000000 python -m benchmarks scale
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from benchmarks.harness import row, say

ROWS = int(os.environ.get("BENCH_SCALE_ROWS", "30000000"))
RUNS = int(os.environ.get("BENCH_SCALE_RUNS", "5"))
CHUNK = 1_000_000  # rows per INSERT ... SELECT (progress, and each statement stays bounded)
PG_BIN = Path("/usr/lib/postgresql/15/bin")
DAY_S = 86_400
PROVIDERS = ("holysheep", "direct")
MODELS = ("deepseek-chat-v3.2", "claude-sonnet-4-20250514", "gemini-2.5-flash", "gpt-4.1")
INTENTS = ("coding", "general", "long_context")
SOURCES = ("loadgen", "api")
SESSIONS = 100_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A PostgreSQL cluster of this benchmark's own, removed on close."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gw-scale-pg-", dir=os.environ.get("BENCH_SCALE_DIR")))
        shutil.chown(self.dir, "postgres", "postgres")
        self.port = _free_port()
        self.data = self.dir / "data"

    def _pg(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True)

    def start(self) -> str:
        self._pg(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        opts = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c autovacuum=off -c shared_buffers=1GB -c max_wal_size=16GB "
            "-c maintenance_work_mem=512MB -c work_mem=64MB"
        )
        self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start")
        self._pg(str(PG_BIN / "createdb"), "-h", str(self.dir), "-p", str(self.port), "gateway")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/gateway"

    def close(self) -> None:
        try:
            self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _arr(values) -> str:
    return "ARRAY[" + ", ".join(f"'{v}'" for v in values) + "]"


def _fill_log(conn, first: int, count: int, start: float, gap: float) -> None:
    # Row i: one attempt of request i at start + i * gap; every 20th failed (then a second row would
    # follow in reality; one row keeps the arithmetic plain), every 50th substituted.
    conn.execute(
        text(f"""
        INSERT INTO request_log (request_id, attempt, ts, provider, model, requested_model, intent, side,
            status, http_status, error_class, latency_ms, ttft_ms, prompt_tokens, cached_tokens,
            completion_tokens, cost_usd, fallback, final, substituted, stream, source, session_id, api,
            tool_calls, reasoning_tokens)
        SELECT 'b' || lpad(i::text, 9, '0'), 1, {start} + i * {gap},
            ({_arr(PROVIDERS)})[1 + (i % 10 >= 7)::int], ({_arr(MODELS)})[1 + i % 4], 'auto',
            ({_arr(INTENTS)})[1 + i % 3], CASE WHEN i % 10 >= 7 THEN 'fallback' ELSE 'primary' END,
            CASE WHEN i % 20 = 0 THEN 'error' ELSE 'ok' END, CASE WHEN i % 20 = 0 THEN 503 ELSE 200 END,
            CASE WHEN i % 20 = 0 THEN 'upstream_5xx' END, 50 + (i * 7919) % 3000,
            CASE WHEN i % 2 = 0 THEN 20 + (i * 31) % 400 END, 50 + i % 4000, (i % 4000) / 3,
            20 + i % 800, 0.0001 * (1 + i % 50), i % 10 >= 7, true, i % 50 = 0, i % 2 = 0,
            ({_arr(SOURCES)})[1 + i % 2], 's' || (i % {SESSIONS}), 'chat', 0, 0
        FROM generate_series({first}::bigint, {first + count - 1}) AS i
        """)
    )


def _fill_rollups(conn, start: float, end: float, rows: int) -> None:
    from core.histogram import bucket_of
    from db.models import LATENCY_BUCKETS, TTFT_BUCKETS

    combos = len(PROVIDERS) * len(MODELS) * len(INTENTS) * len(SOURCES)
    minutes = int((end - start) // 60)
    per_cell = max(1, rows // (minutes * combos))
    lat, ttft = LATENCY_BUCKETS[bucket_of(1500.0)], TTFT_BUCKETS[bucket_of(200.0)]
    for table, span in (("request_rollup", 60), ("request_rollup_5m", 300), ("request_rollup_1h", 3600)):
        n = per_cell * span // 60
        conn.execute(
            text(f"""
            INSERT INTO {table} (minute, provider, model, intent, source, side, attempts, requests, errors,
                request_errors, fallbacks, prompt_tokens, cached_tokens, completion_tokens, cost_usd,
                latency_sum_ms, ttft_sum_ms, ttft_count, reasoning_tokens, tool_calls, responses_requests,
                embeddings_requests, completions_requests, {", ".join(LATENCY_BUCKETS)}, {", ".join(TTFT_BUCKETS)})
            SELECT m, p, mo, it, so, CASE WHEN p = '{PROVIDERS[0]}' THEN 'primary' ELSE 'fallback' END,
                {n}, {n}, {n // 20}, {n // 20}, CASE WHEN p = '{PROVIDERS[1]}' THEN {n} ELSE 0 END,
                {n * 2000}, {n * 600}, {n * 400}, {n * 0.0025}, {n * 1500.0}, {n * 100.0}, {n // 2}, 0, 0, 0, 0, 0,
                {", ".join(str(n) if c == lat else "0" for c in LATENCY_BUCKETS)},
                {", ".join(str(n // 2) if c == ttft else "0" for c in TTFT_BUCKETS)}
            FROM generate_series({int(start) // span * span}, {int(end)}, {span}) AS m,
                unnest({_arr(PROVIDERS)}) AS p, unnest({_arr(MODELS)}) AS mo, unnest({_arr(INTENTS)}) AS it,
                unnest({_arr(SOURCES)}) AS so
            """)
        )


def _median(fn, runs: int = RUNS) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), times


def _spread(times: list[float]) -> str:
    return f"min {min(times):.1f}, max {max(times):.1f}"


def run() -> list[dict]:
    from app.monitor import clear_cache
    from benchmarks.monitor_bench import render, render_canary, render_overview, render_request
    from core.records import AttemptRecord
    from db.canary import ensure_setting
    from db.engine import dispose_all, get_engine
    from db.partitions import KEEPER
    from db.requests import insert_batch, prune

    cluster = Cluster()
    out: list[dict] = []
    try:
        url = cluster.start()
        engine = get_engine(url)  # migrations: request_log partitioned by day
        ensure_setting(engine, 0.1)  # what every gateway process does at start
        now = float(int(time.time()) // DAY_S * DAY_S + 6 * 3600)  # 06:00 UTC today: two whole days before
        start, end = now - 6 * 3600 - 2 * DAY_S, now - 6 * 3600
        gap = (end - start) / ROWS
        KEEPER.ensure(engine, [start, start + DAY_S, end - 1, now])
        say(f"  scale: filling {ROWS:,} rows over the two UTC days before {time.strftime('%F', time.gmtime(end))}")
        t_fill = time.perf_counter()
        with engine.connect() as conn:
            conn.exec_driver_sql("SET statement_timeout = 0")
            for first in range(0, ROWS, CHUNK):
                _fill_log(conn, first, min(CHUNK, ROWS - first), start, gap)
                conn.commit()
                say(
                    f"    {min(first + CHUNK, ROWS):>11,} rows, {time.perf_counter() - t_fill:.0f} s "
                    f"({(min(first + CHUNK, ROWS)) / (time.perf_counter() - t_fill):,.0f} rows/s)"
                )
            _fill_rollups(conn, start, end, ROWS)
            conn.commit()
        fill_s = time.perf_counter() - t_fill
        out.append(
            row(
                "fill: rows/s (INSERT ... SELECT generate_series, 6 indexes, fsync off)",
                ROWS / fill_s,
                "rows/s",
                lower_is_better=False,
                n=ROWS,
                measured=f"{ROWS:,} rows in {fill_s:.0f} s",
                digits=0,
            )
        )

        # The insert on a log that has never been analysed (the old pre-check: up to 42 s a batch).
        batch = [
            AttemptRecord(
                request_id=f"new{k:06d}",
                attempt=1,
                ts=end - 30 + k * 0.01,
                provider=PROVIDERS[0],
                model=MODELS[0],
                requested_model="auto",
                intent=INTENTS[0],
                side="primary",
                status="ok",
                latency_ms=40.0,
                session_id="s1",
            )
            for k in range(500)
        ]
        t0 = time.perf_counter()
        insert_batch(engine, batch)
        first_ms = (time.perf_counter() - t0) * 1000.0
        replay_ms, replay_times = _median(lambda: insert_batch(engine, batch))
        out.append(
            row(
                "insert_batch 500 rows, fresh database (no statistics)",
                first_ms,
                "ms",
                n=1,
                measured=f"first batch after the fill, before any ANALYZE; the same batch replayed: p50 "
                f"{replay_ms:.1f} ms ({_spread(replay_times)})",
                digits=1,
            )
        )

        with engine.connect() as conn:
            conn.exec_driver_sql("SET statement_timeout = 0")
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
            log_bytes = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c "
                    "ON c.oid = i.inhrelid WHERE i.inhparent = 'request_log'::regclass"
                )
            ).scalar_one()
            rollup_rows = conn.execute(text("SELECT count(*) FROM request_rollup")).scalar_one()
        out.append(
            row(
                "bytes per million log rows (heap + 6 indexes)",
                float(log_bytes) / ROWS * 1e6 / 1e6,
                "MB",
                n=ROWS,
                measured=f"pg_total_relation_size of the partitions {int(log_bytes) / 1e9:.2f} GB / {ROWS:,} rows; "
                f"a 36 M-row day: {float(log_bytes) / ROWS * 36e6 / 1e9:.1f} GB",
                digits=1,
            )
        )

        def cold_monitor() -> None:
            clear_cache()
            render(engine, now)

        pages = [
            ("Monitor render, 24 h, first (cold cache)", cold_monitor),
            ("Monitor render, 24 h, live refresh", lambda: render(engine, now)),
            ("Overview render", lambda: render_overview(engine, now, list(PROVIDERS), failing=PROVIDERS[0])),
            ("Canary render", lambda: render_canary(engine, now)),
            ("Request drill-down (story + session search)", lambda: render_request(engine, "b000012345", "s12345")),
        ]
        for name, fn in pages:
            fn()  # warm: the first query of each kind pays its plan and buffer reads
            p50, times = _median(fn)
            out.append(
                row(
                    name,
                    p50,
                    "ms",
                    n=len(times),
                    spread=_spread(times),
                    measured=f"{ROWS:,} log rows, {rollup_rows:,} minute-rollup rows",
                    digits=1,
                )
            )

        # Prune the older day through an engine with the CLI's timeouts (30 s per statement).
        dispose_all()
        engine = get_engine(url)
        t0 = time.perf_counter()
        result = prune(
            engine, raw_before=start + DAY_S, minute_rollups_before=start + DAY_S, rollups_5m_before=start + DAY_S
        )
        prune_s = time.perf_counter() - t0
        out.append(
            row(
                "prune: drop a day of the log (+ its minute and 5-minute rollups)",
                prune_s * 1000.0,
                "ms",
                n=1,
                measured=f"{result} (statement timeout 30 s, lock timeout 10 s)",
                digits=1,
            )
        )
        dispose_all()
    finally:
        cluster.close()
    return out
