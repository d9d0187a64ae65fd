"""Monitor page budget: one render of the 24-hour window over 1,000,000 logged requests in < 300 ms.

"Render" here is everything the page's live fragment computes and hands to Streamlit, without the
Streamlit runtime: ``monitor_view`` (SQL, series, percentiles, KPIs, the eight Plotly figure objects,
) and the request table's first page with its bounded count, plus the serialisation Streamlit performs before sending -
``plotly.io.to_json(fig, validate=False)`` for each chart (what ``st.plotly_chart`` puts in its
message) and the Arrow bytes of the table's page (what ``st.dataframe`` sends). The table's CSV is
produced only when the operator clicks Download, so it is not part of a render. Not included:
protobuf framing, the websocket and the browser's drawing.

The volume is real: 1,000,000 requests (plus their retry attempts) spread evenly over 24 hours
across 2 providers x 4 models x 3 intents x 2 sources, written through
:func:`db.requests.insert_batch` in large batches, so the rollups are exactly what the gateway
would have produced. The database is generated once under ``benchmarks/_work/`` (git-ignored) and
reused; a JSON file next to it records the generation parameters and the window's end time, so
the measured window always holds the full day.

    python -m benchmarks.monitor_bench              # generate if missing, then measure
    python -m benchmarks.monitor_bench --generate   # (re)generate only
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import row, say

WORK = Path(__file__).resolve().parent / "_work"
DB_PATH = WORK / "monitor_1m.db"
META_PATH = WORK / "monitor_1m.json"

N_REQUESTS = 1_000_000
SPAN_S = 24 * 3600
BATCH = 50_000
RUNS = 10
BUDGET_MS = 300.0
SEED = 20240601

PROVIDERS = ("holysheep", "direct")  # primary, fallback
MODELS = ("deepseek-chat-v3.2", "claude-sonnet-4-20250514", "gemini-2.5-flash", "gpt-4.1")
INTENTS = ("coding", "general", "long_context")
SOURCES = ("loadgen", "api")
PRIMARY_SHARE = 0.7
PRIMARY_FAIL = 0.03  # failed primary attempts, retried on the fallback
META_VERSION = 2  # 2: five-minute and hourly rollup tables


def _url() -> str:
    return f"sqlite:///{DB_PATH}"


def _records(rng: random.Random, start: float, first: int, count: int) -> list:
    """Requests ``first .. first+count-1``: each one ok attempt, some preceded by a failed one."""
    from app import catalog
    from core.records import AttemptRecord

    out = []
    gap = SPAN_S / N_REQUESTS
    for k in range(first, first + count):
        ts = start + k * gap
        model, intent, source = rng.choice(MODELS), rng.choice(INTENTS), rng.choice(SOURCES)
        side = "primary" if rng.random() < PRIMARY_SHARE else "fallback"
        provider = PROVIDERS[0] if side == "primary" else PROVIDERS[1]
        stream = rng.random() < 0.5
        prompt = rng.randint(50, 4000)
        cached = int(prompt * rng.random() * 0.6)
        completion = rng.randint(20, 800)
        rid = f"b{k:08d}"
        base = dict(
            request_id=rid,
            requested_model="auto",
            model=model,
            intent=intent,
            side=side,
            source=source,
            stream=stream,
            session_id=f"s{k % 997}",
        )
        attempt, fallback = 1, False
        if side == "primary" and rng.random() < PRIMARY_FAIL:
            out.append(
                AttemptRecord(
                    **base,
                    attempt=1,
                    ts=ts,
                    provider=provider,
                    status="error",
                    latency_ms=rng.lognormvariate(5.5, 0.6),
                    http_status=503,
                    error_class="server_error",
                    error_message="upstream unavailable",
                    final=False,
                )
            )
            attempt, fallback, provider = 2, True, PROVIDERS[1]
        latency = rng.lognormvariate(6.3 if provider == PROVIDERS[0] else 6.6, 0.5)
        out.append(
            AttemptRecord(
                **base,
                attempt=attempt,
                ts=ts,
                provider=provider,
                status="ok",
                latency_ms=latency,
                http_status=200,
                ttft_ms=latency * rng.uniform(0.1, 0.4) if stream else None,
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=completion,
                cost_usd=catalog.cost_usd(model, prompt, cached, completion),
                fallback=fallback,
                final=True,
            )
        )
    return out


def generate(force: bool = False) -> dict:
    """Create the 1M-request database (or reuse a complete one); returns its metadata."""
    if not force and META_PATH.exists() and DB_PATH.exists():
        meta = json.loads(META_PATH.read_text())
        if meta.get("version") == META_VERSION and meta.get("complete"):
            return meta
    from db.engine import dispose_all, get_engine
    from db.requests import insert_batch

    WORK.mkdir(parents=True, exist_ok=True)
    for p in (DB_PATH, Path(f"{DB_PATH}-wal"), Path(f"{DB_PATH}-shm"), META_PATH):
        p.unlink(missing_ok=True)
    engine = get_engine(_url())
    end = float(int(time.time() // 60) * 60)
    start = end - SPAN_S
    rng = random.Random(SEED)
    t0, rows = time.perf_counter(), 0
    for first in range(0, N_REQUESTS, BATCH):
        rows += insert_batch(engine, _records(rng, start, first, min(BATCH, N_REQUESTS - first)))
        done = first + BATCH
        print(
            f"  generated {min(done, N_REQUESTS):>9,} / {N_REQUESTS:,} requests "
            f"({rows:,} attempt rows, {time.perf_counter() - t0:5.0f} s)",
            flush=True,
        )
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")
    dispose_all()
    meta = {
        "version": META_VERSION,
        "complete": True,
        "requests": N_REQUESTS,
        "attempt_rows": rows,
        "start": start,
        "end": end,
        "generate_s": round(time.perf_counter() - t0, 1),
    }
    META_PATH.write_text(json.dumps(meta, indent=2))
    return meta


def _dist(fn, runs: int = RUNS) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def render(engine, now: float) -> int:
    """One render of the page's live part: the view, then what Streamlit serialises from it.
    Returns the bytes produced (so nothing is optimised away and the size can be reported)."""
    import plotly.io

    from app.monitor.view import monitor_view

    view = monitor_view(engine, "24h", None, now)
    size = sum(len(plotly.io.to_json(fig, validate=False)) for fig in view.figures.values())
    return size + render_table(engine, now)


def render_table(engine, now: float, rows=None, cursor=None) -> int:
    """One render of the request table at ``cursor`` (default: its first page): the page, its
    bounded count (and, below the first page, the count of rows above it) and the Arrow bytes. The
    CSV is produced only when the operator clicks Download, so it is not part of a render."""
    from streamlit import dataframe_util

    from app.monitor.view import table_view

    page = table_view(engine, window="24h", rows=rows, cursor=cursor, now=now)
    return len(dataframe_util.convert_anything_to_arrow_bytes(page.rows))


def second_page(engine, now: float, rows):
    """The cursor of the page after the first, as the Older button leaves it."""
    from app.monitor.table import TableCursor
    from app.monitor.view import table_view

    cursor = TableCursor()
    return cursor.older(table_view(engine, window="24h", rows=rows, cursor=cursor, now=now))


def _figures_json(figures) -> int:
    import plotly.io

    return sum(len(plotly.io.to_json(fig, validate=False)) for fig in figures)


def render_overview(engine, now: float, providers: list[str], failing: str | None = None) -> int:
    """The Overview's data and figures, as ``ui.resources`` reads them for a first render (and as
    each tick of its live fragments reads them again). ``failing`` names a provider to treat as
    failing over the last minute, so the incident banner's reads run too (the dataset has none)."""
    from app.dashboard.overview import OVERVIEW_WINDOW_S, overview_figures
    from app.monitor.figures import Counts, live_figures
    from app.monitor.incidents import current_incidents
    from app.monitor.stats import overview_stats, provider_health
    from db.canary import get_state
    from db.events import latest_breaker_states
    from db.faults import all_faults
    from db.monitor import has_requests

    get_state(engine)
    overview_stats(engine, now=now, window_s=900)
    has_requests(engine)
    provider_health(engine, providers=providers, now=now, window_s=300)
    all_faults(engine)
    latest_breaker_states(engine, since=now - 86_400)
    figures = live_figures(engine, now=now, window_s=OVERVIEW_WINDOW_S)
    last_minute = dict(figures.providers_last_minute)
    if failing:
        last_minute[failing] = Counts(attempts=20, attempt_errors=20, requests=20, request_errors=20)
    current_incidents(engine, providers, now=now, last_minute=last_minute, primary=providers[0])
    return _figures_json(overview_figures(engine, now=now).values())


def render_canary(engine, now: float) -> int:
    """The Canary page's data and figures (audit step chart, observed split, guardrail reading)."""
    from app.dashboard.charts import ratio_step_figure, split_figure
    from app.monitor.stats import observed_split
    from db.canary import audit_log, get_guardrail, get_state
    from db.faults import all_faults
    from db.monitor import provider_error_rate

    current = get_state(engine)
    audit = audit_log(engine, limit=200)
    minutes = 60
    split = observed_split(engine, now=now, minutes=minutes)
    g = get_guardrail(engine)
    provider_error_rate(engine, "holysheep", g.window_minutes, now)
    all_faults(engine)
    return _figures_json([ratio_step_figure(audit, current, now), split_figure(split, audit, current, now, minutes)])


def render_request(engine, request_id: str, session_id: str) -> int:
    """The request drill-down: one request's story, and a search by session id."""
    from app.monitor import load_story, search

    story = load_story(engine, request_id)
    found = search(engine, "session", session_id)
    return (1 if story else 0) + len(found.matches)


def run() -> list[dict]:
    """Measure one render of the 24 h window (no filters) over the 1M-request database.

    The budget applies to the first render of the window (empty settled-bucket cache: every bucket
    read from the rollups) and to live refreshes (which re-read only the unsettled tail). Each
    figure is the median of ``RUNS`` runs (5 for the cold one), with min-max.
    """
    from app.monitor import clear_cache, window_series
    from app.monitor.view import monitor_view
    from db.engine import get_engine
    from db.monitor import filter_options

    meta = generate()
    engine = get_engine(_url())
    now = meta["end"]
    say(
        f"  monitor: 24 h window over {meta['requests']:,} requests ({meta['attempt_rows']:,} attempt rows) in SQLite; "
        "'render' = monitor_view + plotly.io.to_json of each figure + Arrow bytes of the table"
    )

    def cold() -> None:
        clear_cache()
        render(engine, now)

    cold_ms = _dist(cold, runs=5)
    size = render(engine, now)
    render_ms = _dist(lambda: render(engine, now))
    view_ms = _dist(lambda: monitor_view(engine, "24h", None, now))
    series_ms = _dist(lambda: window_series(engine, since=now - SPAN_S, until=now))
    options_ms = _dist(lambda: filter_options(engine, since=now - SPAN_S))
    what = f"monitor_view + serialisation ({size:,} bytes of chart JSON and the table page's Arrow bytes per render)"
    from sqlalchemy import text

    with engine.connect() as conn:
        request_id, session_id = conn.execute(
            text("SELECT request_id, session_id FROM request_log WHERE session_id IS NOT NULL ORDER BY id DESC LIMIT 1")
        ).one()
    from db.canary import ensure_setting

    ensure_setting(engine, 0.1)  # what every gateway process does at start (the dataset has no setting row)
    providers = ["holysheep", "direct"]
    overview_ms = _dist(lambda: render_overview(engine, now, providers))
    incident_ms = _dist(lambda: render_overview(engine, now, providers, failing="holysheep"))
    canary_ms = _dist(lambda: render_canary(engine, now))
    request_ms = _dist(lambda: render_request(engine, request_id, session_id))
    from db.raw_log import RowFilters

    failed = RowFilters(status="error")
    table_failed_ms = _dist(lambda: render_table(engine, now, failed))
    older = second_page(engine, now, failed)
    table_older_ms = _dist(lambda: render_table(engine, now, failed, older))
    pages = "the page's queries as ui.resources makes them (no cache) + plotly.io.to_json of its figures"
    return [
        _result("overview page first render / 1M requests", overview_ms, BUDGET_MS, pages),
        _result(
            "overview page first render with an incident banner / 1M requests",
            incident_ms,
            BUDGET_MS,
            pages + "; holysheep failing: the banner's lookback reads",
        ),
        _result("canary page first render / 1M requests", canary_ms, BUDGET_MS, pages),
        _result("request drill-down first render / 1M requests", request_ms, BUDGET_MS, "load_story + session search"),
        _result("render 24h / 1M requests incl. serialisation, first render, empty cache", cold_ms, BUDGET_MS, what),
        _result("render 24h / 1M requests incl. serialisation, live refresh", render_ms, BUDGET_MS, what),
        _result("  of which monitor_view (data + figure objects), live refresh", view_ms, None),
        _result("  of which window_series, live refresh", series_ms, None),
        _result("filter_options 24h", options_ms, BUDGET_MS),
        _result("request table 24h, status = error, first page + count", table_failed_ms, BUDGET_MS),
        _result("request table 24h, status = error, second page + both counts", table_older_ms, BUDGET_MS),
    ]


def _result(name: str, samples: list[float], budget_ms: float | None, measured: str = "") -> dict:
    return row(
        f"{name} (median)",
        statistics.median(samples),
        "ms",
        budget=budget_ms,
        n=len(samples),
        spread=f"min {min(samples):.1f}, max {max(samples):.1f} ms",
        measured=measured,
        digits=1,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.monitor_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--generate", action="store_true", help="(re)generate the database and stop")
    args = ap.parse_args(argv)
    if args.generate:
        print(json.dumps(generate(force=True), indent=2))
        return 0
    results = run()
    for r in results:
        budget = "no budget" if r["budget"] is None else f"budget {r['budget']:g} ms"
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['name']}: {r['value']} {r['unit']} ({budget})")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
