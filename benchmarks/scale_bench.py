"""The log at the source's scale (issue 18, item 10; issue 28, item 7): the Monitor, Overview,
Canary and drill-down reads at several log sizes, on PostgreSQL and on SQLite, to show that each
page's render time stays flat as the log grows.

``BENCH_SCALE_SIZES`` (default ``1000000,5000000,15000000``; 420 req/s is about 36 M a day) lists
the sizes, ``BENCH_SCALE_DBS`` (default ``postgresql,sqlite``) the databases. One database per
kind is grown from one size to the next (rows are added, never rewritten), and at each size:

- the error-class and substitution rollups are rebuilt by migration 0013 itself (downgraded and
  upgraded again: its backfill time at that size is reported);
- every query the Monitor page issues is timed on its own, the filter choices included
  (``filter_options``, ``error_classes_between``, the gateway keys, ``substitution_sums``, the
  request table's page and bounded count unfiltered and with each kind of filter, the last
  minute's raw counts), then whole page renders: the Monitor (1 h, the page's default, and 24 h;
  cold = empty settled-bucket cache, and live refresh; unfiltered and with a provider filter plus
  "status = error" and an error class), the Overview, the Canary page (also with a rollout running
  for 30 minutes: its panel's analysis reads the log since the rollout started), a request
  drill-down.

PostgreSQL: ``initdb`` into a temporary directory as the ``postgres`` user, started on a free port
on 127.0.0.1 (``fsync=off``: a throwaway cluster; the fill is what it speeds up, the measured reads
are served from memory either way; autovacuum off, ANALYZE after each growth, as autovacuum would
have). SQLite: a file in a temporary directory, WAL as the gateway opens it, never analysed (the
gateway does not). The schema is made by the gateway's own migrations (on PostgreSQL
``request_log`` is partitioned by day). Rows are generated in SQL (``generate_series`` / a
recursive CTE), spread over the two days before the measured ``now`` in a scrambled order so every
prefix covers the whole span (growing the log raises the rate, as a busier gateway would). On disk
they lie in time order, as a log written while the requests happen does: each million is inserted
sorted by ``ts``, and on PostgreSQL the table is clustered on ``ts`` after each growth (SQLite keeps
one time-ordered run per million). Left scrambled, every row of a minute would sit on a page of its
own, and each raw read of a partial minute would touch one page per row, which no real log does. 100,000
sessions, 5 % failed (three error classes), 2 % substituted, a third with a gateway key. The
per-minute, 5-minute and hourly rollups are generated too, one row per (minute, provider, model,
intent, source, side) over the span, so the Monitor reads the number of rollup rows a real day
produces (their values are not the log's sums: that is what the unit tests check; here only the
volume matters). At the largest PostgreSQL size also: one 500-row ``insert_batch`` before any
ANALYZE, ``prune`` dropping the older day, and bytes per million rows.

Budget: every page render < 300 ms at every size (a row per page and size; the query rows carry
no budget, they say where a render's time goes). Beside each row's wall time: the CPU the bench
process spent and, on PostgreSQL, the cluster's (:meth:`Cluster.cpu_ms`): on a shared machine their
sum is the steadier figure, what the call costs a quiet one less the round trips' waits.

    BENCH_SCALE_SIZES=1000000,5000000 BENCH_SCALE_DBS=sqlite python -m benchmarks scale
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
from typing import Any

from sqlalchemy import text

from benchmarks.harness import row, say

SIZES = [int(v) for v in os.environ.get("BENCH_SCALE_SIZES", "1000000,5000000,15000000").split(",") if v.strip()]
DBS = [v.strip() for v in os.environ.get("BENCH_SCALE_DBS", "postgresql,sqlite").split(",") if v.strip()]
RUNS = int(os.environ.get("BENCH_SCALE_RUNS", "5"))
BUDGET_MS = 300.0  # every page render, at every size
SPAN_S = 2 * 86_400  # the rows cover the two days before ``now``
# Row i lands at SCRAMBLE * i mod SPAN_MS milliseconds into the span: distinct for every i below
# SPAN_MS (SCRAMBLE is prime), and any prefix of the rows covers the whole span evenly.
SCRAMBLE, SPAN_MS = 2_654_435_761, SPAN_S * 1000
KEYS = ("team-a", "team-b")
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

    def cpu_ms(self) -> float:
        """CPU milliseconds (user + system) the cluster's processes (the postmaster and its
        children: the backends serving the benchmark, the background workers) have used so far."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        ticks = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            if int(entry.name) == postmaster or int(fields[1]) == postmaster:  # fields[1]: ppid
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
        return ticks * 1000.0 / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        try:
            self._pg(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _pick(values, expr: str) -> str:
    return f"CASE ({expr}) " + " ".join(f"WHEN {i} THEN '{v}'" for i, v in enumerate(values)) + " END"


# One row in 99,991 is a timeout on the fallback provider, whose other rows never fail: the sparse
# match of an error class and a provider (5 rows a day at 1 M rows, 75 at 15 M) among the
# primary's timeouts (one row in 60).
SPARSE = "i % 99991 = 17"


def _fill_log(conn, dialect: str, first: int, count: int, start: float) -> None:
    # Row i: one attempt of request i; every 20th failed (three classes; in reality a second row
    # would follow, one row keeps the arithmetic plain), every 50th substituted, a third keyed.
    last = first + count - 1
    select_rows = f"""
        SELECT 'b' || i, 1, {start} + ((i * {SCRAMBLE}) % {SPAN_MS}) * 0.001,
            {_pick(PROVIDERS, f"CASE WHEN i % 10 >= 7 OR {SPARSE} THEN 1 ELSE 0 END")}, {_pick(MODELS, "i % 4")},
            'auto', {_pick(INTENTS, "i % 3")}, CASE WHEN i % 10 >= 7 THEN 'fallback' ELSE 'primary' END,
            CASE WHEN i % 20 = 0 OR {SPARSE} THEN 'error' ELSE 'ok' END,
            CASE WHEN i % 20 = 0 OR {SPARSE} THEN 503 ELSE 200 END,
            CASE WHEN {SPARSE} THEN 'timeout'
                ELSE CASE i % 60 WHEN 0 THEN 'upstream_5xx' WHEN 20 THEN 'timeout' WHEN 40 THEN 'rate_limited' END
            END,
            50 + (i * 7919) % 3000, CASE WHEN i % 2 = 0 THEN 20 + (i * 31) % 400 END, 50 + i % 4000,
            (i % 4000) / 3, 20 + i % 800, 0.0001 * (1 + i % 50), i % 10 >= 7, 1 = 1, i % 50 = 0, i % 2 = 0,
            {_pick(SOURCES, "i % 2")}, 's' || (i % {SESSIONS}), 'chat', 0, 0,
            CASE i % 3 WHEN 0 THEN '{KEYS[0]}' WHEN 1 THEN '{KEYS[1]}' END"""
    cols = """(request_id, attempt, ts, provider, model, requested_model, intent, side,
            status, http_status, error_class, latency_ms, ttft_ms, prompt_tokens, cached_tokens,
            completion_tokens, cost_usd, fallback, final, substituted, stream, source, session_id, api,
            tool_calls, reasoning_tokens, key_name)"""
    if dialect == "postgresql":
        sql = (
            f"INSERT INTO request_log {cols} {select_rows} "
            f"FROM generate_series({first}::bigint, {last}) AS g(i) ORDER BY 3"
        )
        conn.execute(text(sql))
    else:
        sql = (
            f"WITH RECURSIVE g(i) AS (SELECT {first} UNION ALL SELECT i + 1 FROM g WHERE i < {last}) "
            f"INSERT INTO request_log {cols} {select_rows} FROM g ORDER BY 3"
        )
        conn.execute(sql)  # a DB-API cursor (see _grow)


def _rollup_rows(start: float, end: float, rows: int):
    from core.histogram import bucket_of
    from db.models import LATENCY_BUCKETS, ROLLUP_TABLES, TTFT_BUCKETS

    combos = len(PROVIDERS) * len(MODELS) * len(INTENTS) * len(SOURCES)
    per_cell = max(1, rows // (int(end - start) // 60 * combos))
    lat, ttft = LATENCY_BUCKETS[bucket_of(1500.0)], TTFT_BUCKETS[bucket_of(200.0)]
    for span, model in sorted(ROLLUP_TABLES.items()):
        n = per_cell * span // 60
        out = []
        for m in range(int(start) // span * span, int(end) + 1, span):
            for p in PROVIDERS:
                for mo in MODELS:
                    for it in INTENTS:
                        for so in SOURCES:
                            cell: dict[str, Any] = {c: 0 for c in (*LATENCY_BUCKETS, *TTFT_BUCKETS)}
                            cell.update(
                                minute=m, provider=p, model=mo, intent=it, source=so,
                                side="primary" if p == PROVIDERS[0] else "fallback",
                                attempts=n, requests=n, errors=n // 20, request_errors=n // 20,
                                fallbacks=n if p == PROVIDERS[1] else 0, prompt_tokens=n * 2000,
                                cached_tokens=n * 600, completion_tokens=n * 400, cost_usd=n * 0.0025,
                                latency_sum_ms=n * 1500.0, ttft_sum_ms=n * 100.0, ttft_count=n // 2,
                                reasoning_tokens=0, tool_calls=0, responses_requests=0,
                                embeddings_requests=0, completions_requests=0,
                            )  # fmt: skip
                            cell[lat], cell[ttft] = n, n // 2
                            out.append(cell)
        yield model.__table__, out  # type: ignore[attr-defined]


def _fill_rollups(engine, start: float, end: float, rows: int) -> None:
    with engine.begin() as conn:
        for table, cells in _rollup_rows(start, end, rows):
            # PostgreSQL: TRUNCATE, not DELETE. Each size refills the rollups, and a DELETE leaves the
            # last size's rows behind as dead tuples (autovacuum is off here) for every rollup read
            # to step over, which a gateway's own rollups (updated in place, vacuumed) never carry.
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql(f"TRUNCATE {table.name}")
            else:
                conn.execute(table.delete())
            for i in range(0, len(cells), 5000):
                conn.execute(table.insert(), cells[i : i + 5000])


def _rebuild_detail_rollups(engine) -> float:
    """Migration 0013 down and up again: its backfill over the log as it is now; seconds taken."""
    from alembic import command

    from db.migrate import alembic_config, upgrade

    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0012")
    t0 = time.perf_counter()
    upgrade(engine)
    return time.perf_counter() - t0


def _median(
    fn, runs: int = RUNS, cpu: list[float] | None = None, server: list[float] | None = None, server_cpu=None
) -> tuple[float, list[float]]:
    """Median wall milliseconds of ``runs`` calls; ``cpu`` collects each call's CPU milliseconds in
    this process (on a loaded machine the steadier figure: all of SQLite's work, and the Python
    work of a page on PostgreSQL), ``server`` each call's CPU milliseconds of the PostgreSQL
    cluster (``server_cpu()``: its processes' CPU so far). The two CPU figures added up are what a
    render costs a quiet machine, less the round trips' waits."""
    times = []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        s0 = server_cpu() if server_cpu else 0.0
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
        if cpu is not None:
            cpu.append((time.process_time() - c0) * 1000.0)
        if server is not None and server_cpu:
            server.append(server_cpu() - s0)
    return statistics.median(times), times


def _spread(times: list[float]) -> str:
    return f"min {min(times):.1f}, max {max(times):.1f}"


def _label(n: int) -> str:
    return f"{n / 1e6:g} M" if n >= 1_000_000 else f"{n:,}"


def monitor_page(engine, now: float, window: str, *, filters=None, rows=None, cold: bool = False) -> int:
    """One render of the Monitor page as ``pages/monitor.py`` issues it: the filter choices, the
    live part (``monitor_view`` and the figures' JSON) and the request table (its error-class and
    key choices, its first page and bounded count, the page's Arrow bytes). Returns the bytes made."""
    import plotly.io
    from streamlit import dataframe_util

    from app.monitor import clear_cache
    from app.monitor.table import error_class_choices, key_choices
    from app.monitor.view import filter_choices, monitor_view, table_view, window_seconds

    if cold:
        clear_cache()
    filter_choices(engine, window, filters, now=now)
    view = monitor_view(engine, window, filters, now, routes=ROUTES, intent_models=INTENT_MODELS)
    size = sum(len(plotly.io.to_json(fig, validate=False)) for fig in view.figures.values())
    error_class_choices(engine, since=now - window_seconds(window), until=now)
    key_choices(engine)
    page = table_view(engine, window=window, filters=filters, rows=rows, now=now)
    return size + len(dataframe_util.convert_anything_to_arrow_bytes(page.rows))


ROUTES = {"primary": PROVIDERS[0], "fallback": PROVIDERS[1]}
INTENT_MODELS = {"coding": MODELS[0], "general": MODELS[2], "long_context": MODELS[2]}


def _queries(engine, now: float):
    """(name, call) for every query the Monitor page issues, one by one."""
    from app.monitor.table import TableCursor, key_choices
    from app.monitor.view import table_view
    from db import monitor as dbm
    from db import raw_log
    from db.events import events_between

    hour, day = now - 3600, now - 86_400
    failed = raw_log.RowFilters(status="error")
    klass = raw_log.RowFilters(error_classes=("timeout",))
    beta = dbm.MonitorFilters(providers=(PROVIDERS[1],))
    keyed = raw_log.RowFilters(keys=(KEYS[0],))

    def second_page_count():
        first = table_view(engine, window="1h", rows=failed, now=now)
        table_view(engine, window="1h", rows=failed, cursor=TableCursor().older(first), now=now)

    def count(since: float, **kw):
        return lambda: raw_log.count_log_rows(engine, since=since, until=now, **kw)

    def classes(since: float):
        return lambda: dbm.error_classes_between(engine, since=since, until=now)

    def page(**kw):
        return lambda: raw_log.log_page(engine, since=day, until=now, limit=51, **kw)

    return [
        ("filter_options 1 h (filter choices)", lambda: dbm.filter_options(engine, since=hour)),
        ("filter_options 24 h", lambda: dbm.filter_options(engine, since=day)),
        ("error_classes_between 1 h (error-class choices)", classes(hour)),
        ("error_classes_between 24 h", classes(day)),
        ("key choices (gateway keys)", lambda: key_choices(engine)),
        ("substitution_sums 1 h", lambda: dbm.substitution_sums(engine, since=hour, until=now)),
        ("substitution_sums 24 h", lambda: dbm.substitution_sums(engine, since=day, until=now)),
        ("recent_counts last minute", lambda: raw_log.recent_counts(engine, since=now - 60, until=now)),
        ("events_between 24 h", lambda: events_between(engine, since=day, until=now)),
        ("count_log_rows 1 h", count(hour)),
        ("count_log_rows 24 h", count(day)),
        ("count_log_rows 24 h, status = error", count(day, rows=failed)),
        ("count_log_rows 24 h, error class", count(day, rows=klass)),
        ("count_log_rows 24 h, provider", count(day, filters=beta)),
        ("count_log_rows 1 h, gateway key (raw, capped)", count(hour, rows=keyed)),
        ("log_page 24 h, first page", page()),
        ("log_page 24 h, status = error", page(rows=failed)),
        ("log_page 24 h, error class + provider", page(filters=beta, rows=klass)),
        ("request table 1 h, status = error, second page + both counts", second_page_count),
        ("request table 1 h, gateway key (page + count to the table's cap)",
         lambda: table_view(engine, window="1h", rows=keyed, now=now)),
        ("request table 24 h, provider + error class (page + count)",
         lambda: table_view(engine, window="24h", filters=beta, rows=klass, now=now)),
    ]  # fmt: skip


def _pages(engine, now: float):
    """(name, call) for each whole page render; each carries the budget."""
    from benchmarks.monitor_bench import render_canary, render_overview, render_request
    from db import monitor as dbm
    from db import raw_log

    failing = (
        dbm.MonitorFilters(providers=(PROVIDERS[1],)),
        raw_log.RowFilters(status="error", error_classes=("timeout",)),
    )
    return [
        ("Monitor render 1 h, first (cold cache)", lambda: monitor_page(engine, now, "1h", cold=True)),
        ("Monitor render 1 h, live refresh", lambda: monitor_page(engine, now, "1h")),
        ("Monitor render 24 h, first (cold cache)", lambda: monitor_page(engine, now, "24h", cold=True)),
        ("Monitor render 24 h, live refresh", lambda: monitor_page(engine, now, "24h")),
        (
            "Monitor render 24 h, provider + status = error + error class, cold",
            lambda: monitor_page(engine, now, "24h", filters=failing[0], rows=failing[1], cold=True),
        ),
        ("Overview render", lambda: render_overview(engine, now, list(PROVIDERS), failing=PROVIDERS[0])),
        ("Canary render", lambda: render_canary(engine, now)),
        ("Canary render, a rollout running for 30 min (its panel)", lambda: render_canary(engine, now)
         + rollout_panel(engine, now)),
        ("Request drill-down (story + session search)", lambda: render_request(engine, "b12345", "s12345")),
    ]  # fmt: skip


ROLLOUT_AGE_S = 1800  # the rollout the Canary page shows started this long before ``now``


def start_rollout(engine, now: float) -> None:
    """A running rollout of the primary on the global canary, as the Canary page shows one."""
    from core.rollout import Plan
    from db.rollouts import start

    start(engine, Plan(candidate=PROVIDERS[0]), scope="global", actor="bench", reason="scale", now=now - ROLLOUT_AGE_S)


def rollout_panel(engine, now: float) -> int:
    """The Canary page's rollout panel: each rollout's analysis, step samples and timeline."""
    import plotly.io

    from app.dashboard.rollout_panel import views

    return sum(len(plotly.io.to_json(v.figure, validate=False)) + len(v.metrics) for v in views(engine, now))


def _measure(engine, now: float, tag: str, meta: str, server_cpu=None) -> list[dict]:
    out = []
    for kind, items in (("query", _queries(engine, now)), ("page", _pages(engine, now))):
        for name, fn in items:
            fn()  # warm: the first query of each kind pays its plan and buffer reads
            cpu: list[float] = []
            server: list[float] = []
            p50, times = _median(fn, cpu=cpu, server=server, server_cpu=server_cpu)
            cpu_text = f"CPU in this process p50 {statistics.median(cpu):.1f} ms"
            if server:
                # the kernel counts CPU in ticks (10 ms): the mean over the runs, not a median
                cpu_text += f", PostgreSQL's CPU mean {statistics.fmean(server):.1f} ms"
            out.append(
                row(
                    f"{tag}: {name}",
                    p50,
                    "ms",
                    budget=BUDGET_MS if kind == "page" else None,
                    n=len(times),
                    spread=_spread(times),
                    measured=f"{meta}; {cpu_text}" if kind == "page" else cpu_text,
                    digits=1,
                )
            )
            say(f"    {tag}: {name}: {p50:.1f} ms ({_spread(times)}; {cpu_text}; load {os.getloadavg()[0]:.1f})")
    return out


def _grow(engine, dialect: str, have: int, want: int, start: float) -> float:
    t0 = time.perf_counter()
    if dialect == "postgresql":
        with engine.connect() as conn:
            conn.exec_driver_sql("SET statement_timeout = 0")
            conn.commit()
            for first in range(have, want, CHUNK):
                _fill_log(conn, dialect, first, min(CHUNK, want - first), start)
                conn.commit()
                say(f"    {dialect}: {min(first + CHUNK, want):>11,} rows, {time.perf_counter() - t0:.0f} s")
            # The rows in time order on disk, as a log written while the requests happen lies.
            conn.execution_options(isolation_level="AUTOCOMMIT")  # CLUSTER runs outside a transaction
            conn.exec_driver_sql("SET maintenance_work_mem = '1GB'")
            conn.exec_driver_sql("CLUSTER request_log USING ix_request_log_ts")
            say(f"    {dialect}: clustered on ts, {time.perf_counter() - t0:.0f} s")
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
        return time.perf_counter() - t0
    raw = engine.raw_connection()  # the pragmas below may not run inside a transaction
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA cache_size = -1000000")
        cur.execute("PRAGMA synchronous = OFF")
        for first in range(have, want, CHUNK):
            cur.execute("BEGIN")
            _fill_log(cur, dialect, first, min(CHUNK, want - first), start)
            cur.execute("COMMIT")
            say(f"    {dialect}: {min(first + CHUNK, want):>11,} rows, {time.perf_counter() - t0:.0f} s")
        cur.execute("PRAGMA synchronous = NORMAL")
    finally:
        raw.close()
    return time.perf_counter() - t0


def _run_db(dialect: str, now: float) -> list[dict]:
    from db.engine import dispose_all, get_engine
    from db.partitions import KEEPER

    start = now - SPAN_S
    out: list[dict] = []
    cluster = Cluster() if dialect == "postgresql" else None
    tmp = Path(tempfile.mkdtemp(prefix="gw-scale-sqlite-", dir=os.environ.get("BENCH_SCALE_DIR")))
    try:
        url = cluster.start() if cluster else f"sqlite:///{tmp / 'gateway.db'}"
        engine = get_engine(url)
        from db.canary import ensure_setting

        ensure_setting(engine, 0.1)  # what every gateway process does at start
        start_rollout(engine, now)
        if dialect == "postgresql":
            KEEPER.ensure(engine, [start + k * 3600 for k in range(SPAN_S // 3600 + 1)] + [now])
        have = 0
        for size in SIZES:
            say(f"  scale {dialect}: growing the log to {size:,} rows over the two days before now")
            fill_s = _grow(engine, dialect, have, size, start)
            have = size
            _fill_rollups(engine, start, now, size)
            backfill_s = _rebuild_detail_rollups(engine)
            tag = f"{dialect} {_label(size)}"
            out.append(
                row(
                    f"{tag}: migration 0013 (error-class index + rollups backfill)",
                    backfill_s * 1000.0,
                    "ms",
                    n=1,
                    measured=f"{size:,} log rows; the fill before it took {fill_s:.0f} s",
                    digits=0,
                )
            )
            meta = f"{size:,} log rows over 2 days ({size / SPAN_S * 3600:,.0f} an hour)"
            out.extend(_measure(engine, now, tag, meta, cluster.cpu_ms if cluster else None))
        if dialect == "postgresql":
            out.extend(_pg_write_side(engine, url, now, start))
        dispose_all()
    finally:
        if cluster:
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _pg_write_side(engine, url: str, now: float, start: float) -> list[dict]:
    """At the largest size: one batch insert, bytes per million rows, prune of the older day."""
    from core.records import AttemptRecord
    from db.engine import dispose_all, get_engine
    from db.requests import insert_batch, prune

    rows = SIZES[-1]
    batch = [
        AttemptRecord(
            request_id=f"new{k:06d}", attempt=1, ts=now - 30 + k * 0.01, provider=PROVIDERS[0], model=MODELS[0],
            requested_model="auto", intent=INTENTS[0], side="primary", status="ok", latency_ms=40.0, session_id="s1",
        )
        for k in range(500)
    ]  # fmt: skip
    t0 = time.perf_counter()
    insert_batch(engine, batch)
    first_ms = (time.perf_counter() - t0) * 1000.0
    replay_ms, replay_times = _median(lambda: insert_batch(engine, batch))
    out = [
        row(
            "postgresql: insert_batch 500 rows",
            first_ms,
            "ms",
            n=1,
            measured=f"first batch at {rows:,} rows; the same batch replayed: p50 {replay_ms:.1f} ms "
            f"({_spread(replay_times)})",
            digits=1,
        )
    ]
    with engine.connect() as conn:
        log_bytes = conn.execute(
            text(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c "
                "ON c.oid = i.inhrelid WHERE i.inhparent = 'request_log'::regclass"
            )
        ).scalar_one()
    out.append(
        row(
            "postgresql: bytes per million log rows (heap + indexes)",
            float(log_bytes) / rows,
            "MB",
            n=rows,
            measured=f"pg_total_relation_size of the partitions {int(log_bytes) / 1e9:.2f} GB / {rows:,} rows",
            digits=1,
        )
    )
    dispose_all()
    engine = get_engine(url)
    cut = (start // DAY_S + 1) * DAY_S
    t0 = time.perf_counter()
    result = prune(engine, raw_before=cut, minute_rollups_before=cut, rollups_5m_before=cut)
    out.append(
        row(
            "postgresql: prune the older day (log partition + its rollups)",
            (time.perf_counter() - t0) * 1000.0,
            "ms",
            n=1,
            measured=f"{result} (statement timeout 30 s, lock timeout 10 s)",
            digits=1,
        )
    )
    return out


def run() -> list[dict]:
    now = time.time()
    out: list[dict] = []
    for dialect in DBS:
        if dialect not in ("postgresql", "sqlite"):
            raise SystemExit(f"BENCH_SCALE_DBS: unknown database {dialect!r}; use postgresql and/or sqlite")
        out.extend(_run_db(dialect, now))
    return out
