"""The page's per-part breakdown for the issue-19 families: each part of the cache (K/V, MLA
latent, indexer keys, conv state, recurrent state) with its dtype and the engine rule behind it."""

import pytest

from app.dashboard import kv_page as kv


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
