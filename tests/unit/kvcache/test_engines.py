"""Which MLA layout each engine stores, and bounded parsing of every number a link can carry."""

import base64
import dataclasses
import json
import zlib

import pytest

from app.dashboard import kv_page as page_data
from kvcache import ModelSpec, breakdown, catalog, for_engine, kv_cache_bytes
from kvcache.capacity import parse_decimal, parse_utilization
from kvcache.engines import ENGINES
from tests.support import paths


def test_deepseek_v3_latent_vs_transformers_4_decompressed():
    spec = catalog.model_spec("deepseek-v3")
    # latent: 61 layers x (512 kv_lora_rank + 64 qk_rope_head_dim) x 2 B
    latent = 61 * (512 + 64) * 2
    # transformers 4.x: 61 layers x 128 heads x (K: 128 nope + 64 rope, V: 128) x 2 B
    decompressed = 61 * 128 * ((128 + 64) + 128) * 2
    assert (latent, decompressed) == (70_272, 4_997_120)
    for engine_id in ("vllm", "sglang", "trtllm", "transformers5"):
        assert kv_cache_bytes(for_engine(spec, engine_id), 1) == latent
    t4 = for_engine(spec, "transformers4")
    assert kv_cache_bytes(t4, 1) == decompressed
    assert "MLA decompressed K/V" in t4.attention_label
    # decompressed heads split over tensor parallelism; the latent is replicated
    assert kv_cache_bytes(t4, 1, tp=8) == decompressed // 8
    assert kv_cache_bytes(for_engine(spec, "vllm"), 1, tp=8) == latent


def test_engines_do_not_change_non_mla_models():
    """Only transformers 5 marks the layers of an attention-only model: its fp8 cache is
    QuantizedCache's (fp8 K/V plus per-tensor scales); the K/V bytes in bf16 are everyone's."""
    spec = catalog.model_spec("llama-3.1-8b")
    assert all(for_engine(spec, e) is spec for e in ENGINES if e != "transformers5")
    t5 = for_engine(spec, "transformers5")
    assert {g.layout for g in t5.groups} == {"tf5_fp8"} and "Fp8QuantizedLayer" in t5.groups[0].convention
    assert kv_cache_bytes(t5, 4096) == kv_cache_bytes(spec, 4096)
    assert kv_cache_bytes(t5, 4096, 1, "fp8") == kv_cache_bytes(spec, 4096, 1, "fp8") + 8 * spec.num_layers


def test_decompressed_layout_needs_its_fields():
    spec = catalog.model_spec("deepseek-v3")
    g = spec.group("mla")
    broken = dataclasses.replace(spec, groups=(dataclasses.replace(g, v_head_dim=0),))
    with pytest.raises(ValueError, match="v_head_dim"):
        for_engine(broken, "transformers4")


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine"):
        for_engine(catalog.model_spec("llama-3.1-8b"), "nope")


# --- numbers from links and forms: bounded before any arithmetic ---------------------------------


@pytest.mark.parametrize("raw", ["1e100000000", "1e400", "nan", "inf", "-inf", "1" * 500, "0x10", "1/0", ""])
def test_decimal_parser_refuses_before_computing(raw):
    # Fraction("1e100000000") would build a 100-million-digit integer (the test would hang) and
    # float("1e400") is inf: both are refused by their text first
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        parse_utilization(raw)


def test_decimal_parser_accepts_plain_numbers():
    assert parse_decimal("0.95", "x") == parse_decimal("9.5e-1", "x") == parse_decimal(0.95, "x")
    assert parse_utilization("1") == 1


@pytest.mark.parametrize("raw", ["1e100000000", "1e400", "nan", "inf", "9" * 200])
def test_link_utilization_gets_a_one_line_error_naming_the_field(raw):
    values, errors = page_data.from_query_params({"utilization": raw})
    assert values["utilization"] == page_data.DEFAULTS["utilization"]
    message = errors["utilization"]
    assert "gpu_memory_utilization" in message and "\n" not in message
    assert "above 0 and at most 1" in message


@pytest.mark.parametrize("field", ["context_len", "batch", "gpu_count", "max_num_batched_tokens"])
def test_link_huge_integers_are_refused(field):
    values, errors = page_data.from_query_params({field: "9" * 5000})
    assert values[field] == page_data.DEFAULTS[field] and "at most 12 digits" in errors[field]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("utilization", "1e-31", "exponent"),
        ("reserve_gib", "1e30", "at most 100,000"),
        ("cpu_offload_gib", "-1", "must not be negative"),
        ("pp", 0, "at least 1"),
        ("max_num_batched_tokens", 10**9, "at most 100,000,000"),
        ("engine", "nope", "choose one of"),
    ],
)
def test_form_bounds(field, value, message):
    raw = {**page_data.DEFAULTS, field: value}
    inputs, errors = page_data.validate_inputs(raw)
    assert inputs is None and message in errors[field], errors


# --- a pasted config.json in the shareable link ------------------------------------------------

FALCON_7B = (
    '{"alibi": false, "bias": false, "hidden_size": 4544, "model_type": "falcon", "multi_query": true,'
    ' "new_decoder_architecture": false, "num_attention_heads": 71, "num_hidden_layers": 32, "vocab_size": 65024}'
)


def test_config_round_trips_through_the_link_compressed():
    values = {**page_data.DEFAULTS, "model": page_data.CUSTOM}
    link = page_data.to_query_params(values, FALCON_7B)
    token = link["config"]
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    text, error = page_data.config_from_link(link)
    assert error is None and json.loads(text) == json.loads(FALCON_7B)
    # a catalog model's link carries no config
    assert "config" not in page_data.to_query_params(page_data.DEFAULTS, FALCON_7B)


def test_config_link_is_bounded():
    import random

    rng = random.Random(1)  # incompressible content: the compressed token stays long
    big = json.dumps({f"k{i}": rng.getrandbits(64) for i in range(2000)})
    assert page_data.encode_config(big) is None and page_data.config_too_long_for_link(big)
    assert not page_data.config_too_long_for_link("{broken")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("not base64!", "not a config link"),
        ("A" * 7000, "at most 6,000"),
        ("AAAA", "damaged"),
        # 2 MB of spaces compress to a short token that would inflate past the 1 MB bound
        (base64.urlsafe_b64encode(zlib.compress(b" " * 2_000_000, 9)).rstrip(b"=").decode(), "beyond 1 MB"),
    ],
)
def test_bad_config_links(token, message):
    text, error = page_data.config_from_link({"config": token})
    assert text is None and message in error


# -- kvcache ground truth --------------------------------------------------------------------------
# The transformers5 engine against bytes measured in transformers itself.
#
# tests/fixtures/kvcache/transformers5_truth.json is written by scripts/kv_ground_truth.py (dev-only,
# CPU torch + transformers in a separate virtualenv): each published config of
# ground_truth_configs.json built whole on the meta device, its StaticCache (MiniMax: its own
# MiniMaxCache) filled by a prefill, every cache tensor summed. Nothing here comes from our code.


FIXTURES = paths.FIXTURES / "kvcache"
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
