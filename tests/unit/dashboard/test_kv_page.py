"""The page's data function, its per-field validation, links and exports; the benchmark's shape."""

import csv
import io
import json

import pytest

from app.dashboard import kv_page as kv

LLAMA_70B = json.dumps(
    {
        "model_type": "llama",
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "intermediate_size": 28672,
        "tie_word_embeddings": False,
    }
)


def valid(**changes):
    inputs, errors = kv.validate_inputs({**kv.DEFAULTS, **changes}, changes.pop("config_text", None))
    assert errors == {}
    return inputs


def test_defaults_answer_the_headline_question():
    data = kv.build_page_data(valid())
    assert data.fits and data.capacity.max_concurrency == 14
    assert "Up to 14 such sequences fit" in data.verdict
    assert set(data.figures) == {"memory", "concurrency", "catalog"}
    assert data.breakdown_rows[-1]["bytes"] == 8 * 2 * 80 * 8 * 128 * 32768  # fp8, whole model
    assert any("4 KV heads (8 / TP 2)" in line for line in data.working)
    assert any("8.00x the exact figure" in line for line in data.working)


def test_figures_have_the_expected_traces():
    data = kv.build_page_data(valid())
    memory = data.figures["memory"].to_plotly_json()
    assert [t["name"] for t in memory["data"]][:2] == ["weights", "runtime reserve"]
    assert len(memory["layout"]["shapes"]) == 2  # capacity and usable lines
    catalog_fig = data.figures["catalog"].to_plotly_json()
    assert [t["name"] for t in catalog_fig["data"]] == kv.CATALOG_CHART_DTYPES
    assert len(catalog_fig["data"][0]["x"]) == len(kv.catalog.models())


def test_exports():
    data = kv.build_page_data(valid(prefix_len=1024))
    exported = json.loads(data.export_json())
    assert exported["fits"] is True and exported["capacity"]["max_concurrency"] == 14
    assert exported["prefix"]
    rows = list(csv.DictReader(io.StringIO(data.export_csv())))
    assert {r["section"] for r in rows} == {"breakdown", "capacity", "paged", "prefix", "vllm"}
    assert all(r["value"].lstrip("-").isdigit() for r in rows if r["section"] != "vllm")
    # the vLLM rows carry the allocator's figures as text (fractions, block counts)
    vllm = {r["item"]: r["value"] for r in rows if r["section"] == "vllm"}
    assert vllm["num_blocks"].replace(",", "").isdigit()


def test_does_not_fit_verdicts():
    data = kv.build_page_data(valid(batch=100))
    assert not data.fits and data.verdict.startswith("Does not fit") and "At most 14" in data.verdict
    tiny = kv.build_page_data(valid(model="llama-3.1-405b", gpu="l4-24gb", gpu_count=1, tp=1))
    assert not tiny.fits and "weights" in tiny.verdict


def test_custom_config_matches_catalog():
    inputs, errors = kv.validate_inputs({**kv.DEFAULTS, "model": kv.CUSTOM}, LLAMA_70B)
    assert errors == {}
    data = kv.build_page_data(inputs)
    assert data.whole.total == kv.build_page_data(valid()).whole.total
    assert "estimated" in data.model_rows[4]["value"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("context_len", 0, "at least 1"),
        ("context_len", -5, "at least 1"),
        ("context_len", "1.5", "whole number"),
        ("context_len", 1.5, "whole number"),
        ("context_len", "abc", "whole number"),
        ("context_len", 131073, "at most 131,072 tokens"),
        ("batch", 0, "at least 1"),
        ("batch", 10**7, "at most"),
        ("prefix_len", -1, "at least 0"),
        ("prefix_len", 40000, "cannot be longer"),
        ("gpu_count", 0, "at least 1"),
        ("gpu_count", 3, "multiple of the tensor"),
        ("tp", 0, "at least 1"),
        ("tp", 3, "must divide"),
        ("block_size", 0, "at least 1"),
        ("utilization", 0, "above 0"),
        ("utilization", 1.2, "at most 1"),
        ("utilization", "x", "number"),
        ("reserve_gib", -1, "negative"),
        ("reserve_gib", "lots", "number"),
        ("kv_dtype", "fp7", "choose one of"),
        ("weight_dtype", "fp4", "choose one of"),
        ("state_dtype", "int8", "choose one of"),
        ("gpu", "tpu", "choose one of"),
        ("model", "gpt-9", "Unknown model"),
    ],
)
def test_each_field_error(field, value, message):
    inputs, errors = kv.validate_inputs({**kv.DEFAULTS, field: value})
    assert inputs is None
    assert message in errors[field], errors


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "paste or upload"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"hidden_size": 4096}', "num_hidden_layers"),
        ("x" * (kv.MAX_CONFIG_CHARS + 1), "larger than 1 MB"),
    ],
)
def test_config_errors(text, message):
    inputs, errors = kv.validate_inputs({**kv.DEFAULTS, "model": kv.CUSTOM}, text)
    assert inputs is None and message in errors["config"]


def test_query_param_round_trip():
    values = {**kv.DEFAULTS, "model": "gemma-2-9b", "context_len": 8192, "utilization": 0.95}
    link = kv.to_query_params(values)
    assert link["context_len"] == "8192" and link["utilization"] == "0.95"
    parsed, errors = kv.from_query_params(link)
    assert errors == {} and parsed == values


def test_query_params_bad_values_fall_back_with_messages():
    parsed, errors = kv.from_query_params({"context_len": "lots", "model": "gpt-9", "utilization": "x", "batch": "0"})
    assert parsed["context_len"] == kv.DEFAULTS["context_len"] and "context_len" in errors
    assert parsed["model"] == kv.DEFAULTS["model"] and "model" in errors
    assert "utilization" in errors
    assert parsed["batch"] == 0 and "batch" not in errors  # parsable: validation reports it by the field


def test_benchmark_shape():
    from benchmarks.kvcache_bench import run

    rows = run(repeats=3)
    assert rows and set(rows[0]) == {"name", "value", "unit", "budget", "ok"}
    assert rows[0]["unit"] == "ms" and rows[0]["budget"] == 50.0


def test_swap_space_row_counts_parked_sequences():
    data = kv.build_page_data(valid(swap_gib=16))
    row = next(r for r in data.capacity_rows if r["item"].startswith("CPU swap space"))
    per_gpu_seq = 2 * 80 * 4 * 128 * 1 * 32768  # Llama 3.1 70B, fp8 KV, TP 2, 32k tokens
    assert row["bytes"] == 16 << 30
    assert f"holds {(16 << 30) // per_gpu_seq:,} preempted sequences" in row["item"]


# -- kvcache page parts ----------------------------------------------------------------------------
# The page's per-part breakdown for the issue-19 families: each part of the cache (K/V, MLA
# latent, indexer keys, conv state, recurrent state) with its dtype and the engine rule behind it.


def data_for(**changes):
    raw = {**kv.DEFAULTS, "gpu_count": 8, "tp": 8, "weight_dtype": "fp8", **changes}
    inputs, errors = kv.validate_inputs(raw)
    assert errors == {}, errors
    return kv.build_page_data(inputs)


def parts(data) -> dict[tuple[str, str], tuple[str, int]]:
    return {(r["layers"], r["part"]): (r["dtype"], r["B/sequence"]) for r in data.parts_rows}


def test_falcon_h1_in_transformers_shows_kv_conv_and_float32_recurrent_state():
    data = data_for(
        model="falcon-h1-7b", engine="transformers5", kv_dtype="bf16", context_len=4096, batch=2, gpu_count=1, tp=1
    )
    rows = parts(data)
    assert rows["full attention", "K/V"] == ("bf16", 44 * 2 * 2 * 128 * 2 * 4096)
    assert rows["Mamba-2 state", "conv state"] == ("bf16", 44 * 3584 * 4 * 2)  # conv_kernel columns
    assert rows["Mamba-2 state", "recurrent state"] == ("fp32", 44 * 24 * 128 * 256 * 4)
    conv = next(r for r in data.parts_rows if r["part"] == "conv state")
    assert "cache_utils.py" in conv["convention"] and conv["bytes"] == 2 * conv["B/sequence"]
    assert sum(r["bytes"] for r in data.parts_rows) == data.breakdown_rows[-1]["bytes"]


def test_falcon_h1_in_vllm_uses_kernel_minus_one_columns_and_the_chosen_recurrent_dtype():
    rows = parts(data_for(model="falcon-h1-7b", kv_dtype="bf16", context_len=4096, ssm_dtype="fp32", gpu_count=1, tp=1))
    assert rows["Mamba-2 state", "conv state"] == ("bf16", 44 * 3584 * 3 * 2)
    assert rows["Mamba-2 state", "recurrent state"] == ("fp32", 44 * 24 * 128 * 256 * 4)


def test_deepseek_v32_in_vllm_shows_the_indexer_and_fp8_ds_mla():
    data = data_for(model="deepseek-v3.2-exp", kv_dtype="fp8", context_len=4096)
    rows = parts(data)
    assert rows["MLA latent", "MLA latent"] == ("fp8_ds_mla", 61 * 656 * 4096)
    assert rows["sparse-attention indexer keys", "indexer keys"] == ("fp8 + fp32 scale per 128", 61 * 132 * 4096)
    indexer = next(r for r in data.parts_rows if r["part"] == "indexer keys")
    assert "deepseek_v2.py" in indexer["convention"]


def test_an_engine_that_cannot_keep_the_format_is_an_error_on_the_kv_dtype_field():
    inputs, errors = kv.validate_inputs(
        {**kv.DEFAULTS, "model": "deepseek-v3.2-exp", "gpu_count": 8, "tp": 8, "kv_dtype": "int4"}
    )
    assert inputs is None and "fp8_ds_mla" in errors["kv_dtype"]


def test_minimax_lightning_state_has_no_conv_part():
    rows = parts(data_for(model="minimax-m1-80k", kv_dtype="bf16", context_len=4096, weight_dtype="int4"))
    assert rows["lightning-attention state", "recurrent state"] == ("bf16", 70 * 64 * 128 * 128 * 2)
    assert ("lightning-attention state", "conv state") not in rows


def test_recurrent_dtype_is_validated_and_kept_in_the_link():
    _, errors = kv.validate_inputs({**kv.DEFAULTS, "ssm_dtype": "int8"})
    assert "choose one of" in errors["ssm_dtype"]
    values, link_errors = kv.from_query_params({"ssm_dtype": "fp32"})
    assert values["ssm_dtype"] == "fp32" and not link_errors
    assert kv.to_query_params({**kv.DEFAULTS, "ssm_dtype": "fp32"}, None)["ssm_dtype"] == "fp32"


@pytest.mark.parametrize("engine", ["vllm", "transformers5"])
@pytest.mark.parametrize(
    "model", ["minimax-m1-80k", "falcon-h1-7b", "gemma-3n-e4b", "deepseek-v3.2-exp", "nemotron-h-8b", "jamba-v0.1"]
)
def test_every_new_family_renders_and_its_parts_add_up(model, engine):
    data = data_for(
        model=model, engine=engine, kv_dtype="bf16", weight_dtype="int4", context_len=4096, gpu_count=8, tp=1
    )
    assert sum(r["bytes"] for r in data.parts_rows) == data.breakdown_rows[-1]["bytes"] == data.whole.total
    assert all(r["convention"] for r in data.parts_rows)


def test_transformers_fp8_shows_its_scales_once_for_the_whole_cache():
    """QuantizedCache(backend="fp8"): fp8 K/V per sequence, plus 2 float32 scales per layer kept
    once whatever the batch; the parts still add up to the total."""
    data = data_for(
        model="llama-3.1-8b", engine="transformers5", kv_dtype="fp8", context_len=4096, batch=3, gpu_count=1, tp=1
    )
    rows = parts(data)
    assert rows["full attention", "K/V"] == ("fp8", 32 * 2 * 8 * 128 * 4096)
    scales = next(r for r in data.parts_rows if r["part"].startswith("fp8 scales"))
    assert (scales["dtype"], scales["bytes"]) == ("fp32", 32 * 8)
    assert "Fp8QuantizedLayer" in scales["convention"]
    assert sum(r["bytes"] for r in data.parts_rows) == data.breakdown_rows[-1]["bytes"] == data.whole.total
    assert data.whole.total == 3 * 32 * 2 * 8 * 128 * 4096 + 32 * 8


@pytest.mark.parametrize(("model", "kv_dtype"), [("command-a", "fp8"), ("llama-4-scout", "fp8"), ("glm-4.5", "int4")])
def test_transformers_formats_it_cannot_keep_are_an_error_on_the_kv_dtype_field(model, kv_dtype):
    inputs, errors = kv.validate_inputs(
        {**kv.DEFAULTS, "model": model, "engine": "transformers5", "gpu_count": 8, "tp": 8, "kv_dtype": kv_dtype}
    )
    assert inputs is None and "transformers 5" in errors["kv_dtype"].lower()
    # the fp8 refusal names what transformers checks: the layer types
    assert ("layer_types" in errors["kv_dtype"]) == (kv_dtype == "fp8")


@pytest.mark.parametrize(
    "model", ["llama-4-scout", "command-a", "olmo-3-7b-instruct", "glm-4.5", "kimi-k2-instruct", "minimax-m2"]
)
@pytest.mark.parametrize("engine", ["vllm", "transformers5"])
def test_the_attention_only_families_render_and_add_up(model, engine):
    data = data_for(
        model=model, engine=engine, kv_dtype="bf16", weight_dtype="fp8", context_len=32768, gpu_count=8, tp=8
    )
    assert sum(r["bytes"] for r in data.parts_rows) == data.breakdown_rows[-1]["bytes"] == data.whole.total
    assert data.whole.total > 0


def test_transformers_fp8_scales_come_off_the_capacity_budget():
    """The plan counts the scales once: the batch's bytes are the total the breakdown gives."""
    data = data_for(
        model="qwen3-8b", engine="transformers5", kv_dtype="fp8", context_len=8192, batch=5, gpu_count=1, tp=1
    )
    assert data.capacity.batch_bytes == data.whole.total == 5 * 36 * 2 * 8 * 128 * 8192 + 36 * 8
    assert data.capacity.max_len_sequence_bytes == 36 * 2 * 8 * 128 * data.capacity.max_len + 36 * 8


# -- the page says what it computed ----------------------------------------------------------------
# What the KV page says it computed (issue 28): each cache part's convention matches its layer
# kind whatever the engine, the verdict names the engine it was computed for, and pasting a config
# is offered first in the model list.


ENGINE_IDS = ["vllm", "sglang", "trtllm", "transformers5", "transformers4"]


@pytest.mark.parametrize("engine", ENGINE_IDS)
def test_each_parts_convention_matches_its_layer_kind(engine):
    """Issue 28: a plain GQA config read "MLA latent; ..." in the convention column (the engine's
    note, about MLA, was every part's fallback)."""
    gqa = data_for(model="llama-3.1-8b", engine=engine, kv_dtype="bf16", context_len=4096, gpu_count=1, tp=1)
    (kv_row,) = [r for r in gqa.parts_rows if r["part"] == "K/V"]
    name = kv.ENGINES[engine].name
    conv = kv_row["convention"]
    assert "MLA" not in conv and "latent" not in conv
    if engine != "transformers5":  # transformers 5 has its own rule for K/V (StaticCache, QuantizedCache)
        assert conv.startswith(f"{name}: K and V per KV head; ")
    mla = data_for(model="deepseek-v3", engine=engine, kv_dtype="bf16", context_len=4096, gpu_count=8, tp=8)
    stored = {"transformers4": "MLA decompressed to K/V per head"}.get(engine, "MLA latent")
    for row in mla.parts_rows:
        if engine == "transformers5":  # its own rule, naming what the layer caches
            assert row["convention"].startswith("transformers 5: StaticCache MLA latent in the model dtype")
        else:
            assert row["convention"].startswith(f"{name}: {stored}; "), row


@pytest.mark.parametrize("engine", ENGINE_IDS)
def test_the_verdict_names_the_engine_whatever_the_engine(engine):
    e = kv.ENGINES[engine]
    for batch in (1, 100_000):  # fits, and does not
        data = data_for(model="llama-3.1-8b", engine=engine, kv_dtype="bf16", batch=batch, gpu_count=1, tp=1)
        assert f"Engine: {e.name}, {e.alloc_note}." in data.verdict, data.verdict


def test_a_pasted_config_is_offered_first():
    options = list(kv.model_options())
    assert options[0] == kv.CUSTOM and kv.model_options()[kv.CUSTOM] == "Custom config.json"
    assert kv.DEFAULTS["model"] != kv.CUSTOM  # first in the list, not the default choice
