"""Log ingest: attempt records through the TelemetryWriter into SQLite (raw rows + minute rollups).
Budget: at least 20,000 records/s, measured from the first submit to the end of the final flush.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from app.telemetry.records import AttemptRecord
from app.telemetry.writer import TelemetryWriter
from db.engine import create_db_engine
from db.migrate import upgrade
from db.requests import insert_batch

N = 100_000
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


def run() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    engine = create_db_engine(f"sqlite:///{tmp / 'ingest.db'}")
    upgrade(engine)
    records = make_records(N)
    writer = TelemetryWriter(lambda b: insert_batch(engine, b), queue_size=20_000, batch_size=2_000)
    t0 = time.perf_counter()
    for r in records:
        writer.submit(r)
    writer.close()
    elapsed = time.perf_counter() - t0
    rate = N / elapsed
    engine.dispose()
    return [
        {
            "name": "log ingest into SQLite (records/s)",
            "value": round(rate),
            "unit": "rec/s",
            "budget": 20_000,
            "ok": rate >= 20_000,
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
