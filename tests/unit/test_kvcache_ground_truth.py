"""The transformers5 engine against bytes measured in transformers itself.

tests/fixtures/kvcache/transformers5_truth.json is written by scripts/kv_ground_truth.py (dev-only,
CPU torch + transformers in a separate virtualenv): each published config of
ground_truth_configs.json built whole on the meta device, its StaticCache (MiniMax: its own
MiniMaxCache) filled by a prefill, every cache tensor summed. Nothing here comes from our code.
"""

import json
from pathlib import Path

import pytest

from kvcache import ModelSpec, breakdown, catalog, for_engine, kv_cache_bytes

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
        # the attention-only families the issue lists as exact
        "gpt-oss-20b",
        "llama-4-scout",
        "command-a",
        "olmo-3-7b-instruct",
        "glm-4.5",
        "kimi-k2-instruct",
        "minimax-m2",
        "qwen3-235b-a22b",
    } <= set(TRUTH["models"])
    assert TRUTH["transformers"].startswith("5.")


def architecture(config: dict) -> str:
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    return str(text.get("model_type") or config["model_type"])


def test_every_catalog_architecture_is_measured():
    """The issue: ground truth "run for every family you support": each model_type the catalog ships
    has at least one published config measured in transformers, and every measured config is in the
    fixture at the four lengths."""
    shipped = {architecture(m.config) for m in catalog.models().values()}
    measured = {architecture(CONFIGS[mid]["config"]) for mid in TRUTH["models"]}
    assert shipped <= measured, f"catalog architectures without ground truth: {sorted(shipped - measured)}"
    assert set(CONFIGS) == set(TRUTH["models"])
    assert all([c["seq_len"] for c in e["cases"]] == [1, 4096, 32768, 131072] for e in TRUTH["models"].values())
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


FP8 = [(mid, case) for mid, entry in TRUTH["models"].items() for case in entry.get("fp8", {}).get("cases", [])]


def test_fp8_is_measured_for_the_full_attention_families():
    """transformers has no fp8 StaticCache: its fp8 cache is QuantizedCache(backend="fp8"), which
    takes full-attention models only (cache_utils.py QuantizedCache.__init__) and refuses the rest."""
    assert {"llama-3.1-8b", "qwen3-8b", "deepseek-v3", "mixtral-8x7b", "opt-13b", "glm-4.5", "kimi-k2-instruct"} <= {
        m for m, _ in FP8
    }
    assert all(("fp8" in e) != ("fp8_refused" in e) for e in TRUTH["models"].values())
    for model_id, entry in TRUTH["models"].items():
        kinds = {g.kind for g in spec_of(model_id).groups}
        # measured exactly when every layer is full attention (MLA included), refused otherwise
        assert ("fp8" in entry) == (kinds <= {"full", "mla"}), model_id
        if "fp8_refused" in entry:
            assert "only full attention" in entry["fp8_refused"]


@pytest.mark.parametrize(("model_id", "case"), FP8, ids=[f"{m}-fp8-L{c['seq_len']}" for m, c in FP8])
def test_fp8_matches_transformers_to_the_byte(model_id, case):
    """Every tensor QuantizedCache(backend="fp8") keeps, summed by the script: the float8_e4m3fn K/V
    (or MLA latent) per sequence, and one float32 scale per K and per V tensor of each layer, kept
    once for the whole cache (cache_utils.py Fp8QuantizedLayer)."""
    assert kv_cache_bytes(spec_of(model_id), case["seq_len"], 1, "fp8") == case["bytes"]
    expected: dict[tuple[str, str], int] = {}
    for key, size in case["parts"].items():
        name, dtype = key.rsplit(" ", 1)
        part = "fp8 scales" if name.endswith("_scale") else "cache"
        dtype = {"float8_e4m3fn": "fp8", "float32": "fp32"}[dtype]
        expected[part, dtype] = expected.get((part, dtype), 0) + size
    ours: dict[tuple[str, str], int] = {}
    for row in breakdown(spec_of(model_id), case["seq_len"], 1, "fp8").groups:
        for part, dtype, size in (*row.parts, *row.cache_parts):
            key = ("cache" if part in ("K/V", "MLA latent") else part, dtype)
            ours[key] = ours.get(key, 0) + size
    assert ours == expected


def test_fp8_scales_are_kept_once_whatever_the_batch():
    """The scale is per tensor and a layer's K tensor holds the whole batch: 8 B per layer once,
    the fp8 K/V once per sequence."""
    spec = spec_of("llama-3.1-8b")
    one = kv_cache_bytes(spec, 4096, 1, "fp8")
    assert kv_cache_bytes(spec, 4096, 3, "fp8") == 3 * (one - 8 * 32) + 8 * 32
    assert kv_cache_bytes(spec, 0, 1, "fp8") == kv_cache_bytes(spec, 4096, 0, "fp8") == 0


REFUSED = sorted(mid for mid, entry in TRUTH["models"].items() if "fp8_refused" in entry)


@pytest.mark.parametrize("model_id", REFUSED)
def test_fp8_is_refused_where_transformers_refuses_it(model_id):
    """transformers' QuantizedCache refuses these (the fixture records its message): so does the
    engine, naming the layer kind, instead of an fp8 figure transformers cannot give."""
    with pytest.raises(ValueError, match=r"layer_types|model dtype"):
        kv_cache_bytes(spec_of(model_id), 4096, 1, "fp8")


@pytest.mark.parametrize("kv_dtype", ["fp8_e5m2", "int8", "int4"])
def test_transformers_formats_not_modelled_are_refused(kv_dtype):
    with pytest.raises(ValueError, match=kv_dtype):
        kv_cache_bytes(spec_of("llama-3.1-8b"), 4096, 1, kv_dtype)


VARIANTS = json.loads((FIXTURES / "ground_truth_variants.json").read_text())
VARIANT_TRUTH = json.loads((FIXTURES / "transformers5_variants_truth.json").read_text())["variants"]


@pytest.mark.parametrize("variant", VARIANTS["variants"], ids=[v["id"] for v in VARIANTS["variants"]])
def test_family_defaults_and_field_rules_match_transformers(variant):
    """Small synthetic configs, one per config-class default or field rule the engine applies for
    these families (a published file that leaves the field out): measured in transformers by the
    same script (--variants), every tensor its StaticCache keeps."""
    spec = for_engine(ModelSpec.from_hf_config(variant["config"]), "transformers5")
    truth = VARIANT_TRUTH[variant["id"]]
    assert truth["seq_len"] == VARIANTS["seq_len"]
    assert kv_cache_bytes(spec, truth["seq_len"], 1, "bf16") == truth["bytes"]
