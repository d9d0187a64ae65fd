"""The transformers5 engine against bytes measured in transformers itself.

tests/fixtures/kvcache/transformers5_truth.json is written by scripts/kv_ground_truth.py (dev-only,
CPU torch + transformers in a separate virtualenv): each published config of
ground_truth_configs.json built whole on the meta device, its StaticCache (MiniMax: its own
MiniMaxCache) filled by a prefill, every cache tensor summed. Nothing here comes from our code.
"""

import json
from pathlib import Path

import pytest

from app.kvcache import ModelSpec, breakdown, for_engine, kv_cache_bytes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kvcache"
CONFIGS = {m["id"]: m for m in json.loads((FIXTURES / "ground_truth_configs.json").read_text())["models"]}
TRUTH = json.loads((FIXTURES / "transformers5_truth.json").read_text())
CASES = [(mid, case) for mid, entry in TRUTH["models"].items() for case in entry["cases"]]
# transformers' tensor names -> the breakdown's part names
PART_OF = {
    "keys": "cache",
    "values": "cache",
    "indexer_keys": "indexer keys",
    "conv_states[0]": "conv state",
    "recurrent_states[0]": "recurrent state",
    "linear_cache": "recurrent state",
}
TORCH_NAMES = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def spec_of(model_id: str) -> ModelSpec:
    return for_engine(ModelSpec.from_hf_config(CONFIGS[model_id]["config"]), "transformers5")


def test_every_family_of_the_issue_is_measured():
    assert {
        "minimax-m1-80k",
        "falcon-h1-7b",
        "gemma-3n-e4b",
        "deepseek-v3.2-exp",
        "nemotron-h-8b",
        "qwen3-next-80b-a3b",
        "jamba-v0.1",
    } <= set(TRUTH["models"])
    assert TRUTH["transformers"].startswith("5.")
    for entry in CONFIGS.values():
        assert entry["source"].startswith("https://huggingface.co/")


@pytest.mark.parametrize(("model_id", "case"), CASES, ids=[f"{m}-L{c['seq_len']}" for m, c in CASES])
def test_total_matches_transformers_to_the_byte(model_id, case):
    assert kv_cache_bytes(spec_of(model_id), case["seq_len"], 1, "bf16") == case["bytes"]


@pytest.mark.parametrize(("model_id", "case"), CASES, ids=[f"{m}-L{c['seq_len']}" for m, c in CASES])
def test_each_part_and_its_dtype_matches(model_id, case):
    """K/V (or latent), indexer keys, conv and recurrent states separately, each in its dtype."""
    expected: dict[tuple[str, str], int] = {}
    for key, size in case["parts"].items():
        name, dtype = key.rsplit(" ", 1)
        part = PART_OF[name]
        expected[part, TORCH_NAMES[dtype]] = expected.get((part, TORCH_NAMES[dtype]), 0) + size
    ours: dict[tuple[str, str], int] = {}
    for row in breakdown(spec_of(model_id), case["seq_len"], 1, "bf16").groups:
        for part, dtype, size in row.parts:
            key = ("cache" if part in ("K/V", "MLA latent") else part, dtype)
            ours[key] = ours.get(key, 0) + size
    assert ours == expected


def test_the_documented_wrong_figures_are_gone():
    """The issue's table: what the engine said before, now the measured figure."""
    before = {  # model -> (old figure at L=4096, measured)
        "minimax-m1-80k": 1_342_177_280,  # 80 layers counted as full attention
        "gemma-3n-e4b": 88_080_384,  # 35 layers counted where 20 keep K/V
    }
    for model_id, old in before.items():
        measured = TRUTH["models"][model_id]["cases"][1]["bytes"]
        assert kv_cache_bytes(spec_of(model_id), 4096) == measured != old
