"""What the KV page says it computed (issue 28): each cache part's convention matches its layer
kind whatever the engine, the verdict names the engine it was computed for, and pasting a config
is offered first in the model list."""

import pytest

from app.kvcache import page_data as kv


def data_for(**changes):
    raw = {**kv.DEFAULTS, "gpu_count": 8, "tp": 8, "weight_dtype": "fp8", **changes}
    inputs, errors = kv.validate_inputs(raw)
    assert errors == {}, errors
    return kv.build_page_data(inputs)


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
