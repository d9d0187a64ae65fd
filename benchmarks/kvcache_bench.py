"""Benchmark for the KV-cache calculator: time to compute all data of one page render.

Three renders: the page's defaults; a hybrid model that takes vLLM's grouped allocator (Gemma 3
27B at its full 128k context with a speculative draft model, the most groups and chart points in
the catalog); and a pasted Llama 4 style config with chunked attention at a 1M-token context.
"""

from __future__ import annotations

import json
import statistics
import time

BUDGET_MS = 50.0

LLAMA4_LIKE = {
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "intermediate_size": 8192,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "vocab_size": 202048,
    "max_position_embeddings": 1048576,
    "attention_chunk_size": 8192,
}


def _p50(render, repeats: int) -> float:
    render()  # warm the catalog caches, as a running app would have them
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        render()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def run(repeats: int = 50) -> list[dict]:
    """p50 over `repeats` runs of validate_inputs + build_page_data for each scenario."""
    from app.dashboard import kv_page as page_data

    scenarios = {
        "defaults": ({**page_data.DEFAULTS}, None),
        "Gemma 3 27B at 131,072 with a draft model": (
            {
                **page_data.DEFAULTS,
                "model": "gemma-3-27b",
                "context_len": 131072,
                "draft_model": "llama-3.2-1b",
                "gpu": "h200-141gb",
            },
            None,
        ),
        "pasted chunked-attention config at 1M tokens": (
            {**page_data.DEFAULTS, "model": page_data.CUSTOM, "context_len": 1048576, "gpu_count": 8, "tp": 8},
            json.dumps(LLAMA4_LIKE),
        ),
    }
    rows = []
    for name, (raw, config) in scenarios.items():

        def render(raw=raw, config=config) -> None:
            inputs, errors = page_data.validate_inputs(raw, config)
            assert inputs is not None, errors
            page_data.build_page_data(inputs)

        p50 = _p50(render, repeats)
        label = "kvcache: page data for one render (p50)" if name == "defaults" else f"kvcache: render, {name} (p50)"
        rows.append({"name": label, "value": round(p50, 3), "unit": "ms", "budget": BUDGET_MS, "ok": p50 <= BUDGET_MS})
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
