"""Log ingest: attempt records through the TelemetryWriter into SQLite (raw rows + the minute,
five-minute and hourly rollups), with the shipped writer settings (queue, batch size and flush
interval read from the default configuration, gateway.toml + defaults: batch 500 / queue 10,000).

Measured: ``N`` records submitted one at a time from one thread, timed from the first ``submit`` to
``close()`` returning (everything written), into a fresh SQLite file per run. Reported: median
records/s over ``RUNS`` runs with min-max. Budget: at least 20,000 records/s at the median.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from app.config import load_settings
from app.telemetry.writer import TelemetryWriter
from benchmarks.harness import row, say
from core.records import AttemptRecord
from db.engine import create_db_engine
from db.migrate import upgrade
from db.requests import insert_batch

N = 100_000
RUNS = int(os.environ.get("BENCH_INGEST_RUNS", "3"))
BUDGET = 20_000
REPO = Path(__file__).resolve().parents[1]
PROVIDERS = ["holysheep", "direct"]
MODELS = ["deepseek-chat-v3.2", "gemini-2.5-flash", "claude-sonnet-4-20250514", "gpt-4.1"]
INTENTS = ["coding", "general", "long_context"]


def make_records(n: int, seed: int = 1, start: float | None = None) -> list[AttemptRecord]:
    rng = random.Random(seed)
    t0 = time.time() - 3600 if start is None else start
    out = []
    for i in range(n):
        ok = rng.random() > 0.03
        prompt = rng.randint(20, 4000)
        cached = rng.randint(0, prompt) if rng.random() < 0.4 else 0
        completion = rng.randint(20, 600)
        out.append(
            AttemptRecord(
                request_id=f"bench-{seed}-{i}",
                attempt=1,
                ts=t0 + i * 3600 / n,
                provider=rng.choice(PROVIDERS),
                model=rng.choice(MODELS),
                requested_model="auto",
                intent=rng.choice(INTENTS),
                side=rng.choice(("primary", "fallback")),
                status="ok" if ok else "error",
                latency_ms=rng.lognormvariate(5.5, 0.6),
                ttft_ms=rng.lognormvariate(4.8, 0.5) if ok else None,
                http_status=200 if ok else 503,
                error_class=None if ok else "server_error",
                prompt_tokens=prompt,
                cached_tokens=cached,
                completion_tokens=completion,
                cost_usd=(prompt * 0.3 + completion * 2.5) / 1e6,
                fallback=rng.random() < 0.05,
                source="loadgen",
            )
        )
    return out


def _once(records: list[AttemptRecord], tmp: Path, i: int, queue_size: int, batch_size: int, interval: float) -> float:
    engine = create_db_engine(f"sqlite:///{tmp / f'ingest-{i}.db'}")
    upgrade(engine)
    writer = TelemetryWriter(
        lambda b: insert_batch(engine, b), queue_size=queue_size, batch_size=batch_size, flush_interval_s=interval
    )
    t0 = time.perf_counter()
    for r in records:
        writer.submit(r)
    writer.close()
    elapsed = time.perf_counter() - t0
    if writer.written != len(records) or writer.last_error:
        raise RuntimeError(f"ingest wrote {writer.written} of {len(records)} records: {writer.last_error}")
    engine.dispose()
    return len(records) / elapsed


def run() -> list[dict]:
    shipped = load_settings(REPO / "gateway.toml", env={"DATABASE_URL": "sqlite:///unused.db"}).telemetry
    q, b, interval = shipped.queue_size, shipped.batch_size, shipped.flush_interval_s
    what = (
        f"{N:,} records submitted one at a time through TelemetryWriter(queue_size={q:,}, batch_size={b}, "
        f"flush_interval_s={interval}) into a fresh SQLite file (raw rows + 3 rollup resolutions), "
        "first submit to close() returning"
    )
    say(f"  ingest: {what}; {RUNS} runs (BENCH_INGEST_RUNS)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    records = make_records(N)
    rates = [_once(records, tmp, i, q, b, interval) for i in range(RUNS)]
    return [
        row(
            "log ingest into SQLite, shipped writer settings (records/s, median)",
            statistics.median(rates),
            "rec/s",
            budget=BUDGET,
            lower_is_better=False,
            n=RUNS,
            spread=f"min {min(rates):,.0f}, max {max(rates):,.0f} rec/s over {RUNS} runs of {N:,} records",
            measured=what,
            digits=0,
        )
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
