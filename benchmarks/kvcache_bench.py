"""Benchmark for the KV-cache calculator: time to compute all data of one page render."""

from __future__ import annotations

import statistics
import time

BUDGET_MS = 50.0


def run(repeats: int = 50) -> list[dict]:
    """p50 over `repeats` runs of validate_inputs + build_page_data with the page's defaults."""
    from app.kvcache import page_data

    def render() -> None:
        inputs, errors = page_data.validate_inputs(page_data.DEFAULTS)
        assert inputs is not None, errors
        page_data.build_page_data(inputs)

    render()  # warm the catalog caches, as a running app would have them
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        render()
        samples.append((time.perf_counter() - start) * 1000)
    p50 = statistics.median(samples)
    return [
        {
            "name": "kvcache: page data for one render (p50)",
            "value": round(p50, 3),
            "unit": "ms",
            "budget": BUDGET_MS,
            "ok": p50 <= BUDGET_MS,
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
