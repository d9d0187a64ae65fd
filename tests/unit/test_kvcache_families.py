"""Architecture families' own config conventions, checked against their published config.json files.

Each config below is the cache-relevant part of the file as published on the Hugging Face Hub (the
URL is in the id). Expected bytes per token are computed by hand in the test from the published
numbers and the family's rule in its transformers / vLLM attention code, not from our code:
bf16 K and V = 2 x layers x KV heads x head_dim x 2 bytes.
"""

import pytest

from kvcache import ModelSpec, kv_cache_bytes

# https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json (no max_position_embeddings)
FALCON_7B = {
    "alibi": False,
    "architectures": ["FalconForCausalLM"],
    "bias": False,
    "hidden_size": 4544,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "vocab_size": 65024,
}
# https://huggingface.co/tiiuae/falcon-40b/blob/main/config.json
FALCON_40B = {
    "alibi": False,
    "bias": False,
    "hidden_size": 8192,
    "model_type": "falcon",
    "new_decoder_architecture": True,
    "num_attention_heads": 128,
    "num_hidden_layers": 60,
    "num_kv_heads": 8,
    "parallel_attn": True,
    "vocab_size": 65024,
}
# the original remote-code configs (model_type RefinedWebModel / RefinedWeb, n_head / n_layer names)
FALCON_7B_RW = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True}
FALCON_40B_RW = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60}


def per_token(config: dict) -> int:
    return kv_cache_bytes(ModelSpec.from_hf_config(config), 1, kv_dtype="bf16")


def test_falcon_7b_multi_query_caches_one_kv_head_and_defaults_to_2048_positions():
    spec = ModelSpec.from_hf_config(FALCON_7B)
    # FalconAttention: multi_query -> 1 KV head; head_dim = 4544 / 71 = 64
    assert per_token(FALCON_7B) == 2 * 32 * 1 * 64 * 2 == 8192
    assert spec.max_context == 2048  # FalconConfig(max_position_embeddings=2048)
    notes = " ".join(spec.extras["conventions"])
    assert "max_position_embeddings = 2048" in notes and "FalconConfig" in notes
    assert "multi_query" in notes
    assert spec.attention_label == "MQA 71q/1kv"


def test_falcon_7b_without_multi_query_field_still_multi_query():
    config = {k: v for k, v in FALCON_7B.items() if k != "multi_query"}  # FalconConfig default True
    assert per_token(config) == 8192


def test_falcon_multi_query_false_is_multi_head():
    assert per_token({**FALCON_7B, "multi_query": False}) == 2 * 32 * 71 * 64 * 2


def test_falcon_40b_new_decoder_architecture_uses_num_kv_heads():
    assert per_token(FALCON_40B) == 2 * 60 * 8 * 64 * 2 == 122_880


def test_falcon_new_decoder_architecture_without_num_kv_heads_is_multi_head():
    config = {k: v for k, v in FALCON_40B.items() if k != "num_kv_heads"}
    assert per_token(config) == 2 * 60 * 128 * 64 * 2


@pytest.mark.parametrize(("config", "expected"), [(FALCON_7B_RW, 8192), (FALCON_40B_RW, 122_880)])
def test_refinedweb_names(config, expected):
    spec = ModelSpec.from_hf_config(config)
    assert per_token(config) == expected
    assert spec.max_context == 2048 and spec.num_layers == config["n_layer"]


def test_refinedweb_40b_reads_n_head_kv_and_says_so():
    notes = " ".join(ModelSpec.from_hf_config(FALCON_40B_RW).extras["conventions"])
    assert "read from 'n_head_kv'" in notes and "new_decoder_architecture" in notes


# (published config, bytes per token by hand)
FAMILIES = {
    # https://huggingface.co/openai-community/gpt2/blob/main/config.json: 12 x 768, 12 heads, MHA
    "gpt2": (
        {"model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024},
        2 * 12 * 12 * 64 * 2,
        1024,
    ),
    # https://huggingface.co/openai-community/gpt2-xl/blob/main/config.json
    "gpt2-xl": (
        {"model_type": "gpt2", "n_embd": 1600, "n_head": 25, "n_layer": 48, "n_positions": 1024},
        2 * 48 * 25 * 64 * 2,
        1024,
    ),
    # https://huggingface.co/EleutherAI/gpt-j-6b/blob/main/config.json: head_dim 4096 / 16 = 256
    "gpt-j-6b": (
        {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28, "n_positions": 2048, "rotary_dim": 64},
        2 * 28 * 16 * 256 * 2,
        2048,
    ),
    # https://huggingface.co/EleutherAI/gpt-neox-20b/blob/main/config.json
    "gpt-neox-20b": (
        {
            "model_type": "gpt_neox",
            "hidden_size": 6144,
            "num_attention_heads": 64,
            "num_hidden_layers": 44,
            "max_position_embeddings": 2048,
        },
        2 * 44 * 64 * 96 * 2,
        2048,
    ),
    # https://huggingface.co/bigscience/bloom/blob/main/config.json: n_embed, no length field
    "bloom-176b": (
        {"model_type": "bloom", "n_embed": 14336, "n_layer": 70, "num_attention_heads": 112, "vocab_size": 250880},
        2 * 70 * 112 * 128 * 2,
        2048,
    ),
    # https://huggingface.co/bigscience/bloom-560m/blob/main/config.json
    "bloom-560m": (
        {"model_type": "bloom", "hidden_size": 1024, "n_head": 16, "n_layer": 24, "vocab_size": 250880},
        2 * 24 * 16 * 64 * 2,
        2048,
    ),
    # https://huggingface.co/mosaicml/mpt-7b/blob/main/config.json: attn_config without kv_n_heads
    "mpt-7b": (
        {
            "model_type": "mpt",
            "d_model": 4096,
            "n_heads": 32,
            "n_layers": 32,
            "max_seq_len": 2048,
            "attn_config": {"alibi": True, "attn_type": "multihead_attention"},
        },
        2 * 32 * 32 * 128 * 2,
        2048,
    ),
    # MPT with grouped-query attention (attn_config.kv_n_heads, as vLLM's mpt.py reads it)
    "mpt-gqa": (
        {
            "model_type": "mpt",
            "d_model": 4096,
            "n_heads": 32,
            "n_layers": 32,
            "max_seq_len": 8192,
            "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 8},
        },
        2 * 32 * 8 * 128 * 2,
        8192,
    ),
    # https://huggingface.co/bigcode/starcoder/blob/main/config.json: GPT-BigCode multi-query
    "starcoder": (
        {
            "model_type": "gpt_bigcode",
            "n_embd": 6144,
            "n_head": 48,
            "n_layer": 40,
            "n_positions": 8192,
            "multi_query": True,
        },
        2 * 40 * 1 * 128 * 2,
        8192,
    ),
    # https://huggingface.co/bigcode/starcoder2-15b/blob/main/config.json (window 4096 on every layer)
    "starcoder2-15b": (
        {
            "model_type": "starcoder2",
            "hidden_size": 6144,
            "num_attention_heads": 48,
            "num_key_value_heads": 4,
            "num_hidden_layers": 40,
            "max_position_embeddings": 16384,
            "sliding_window": 4096,
        },
        2 * 40 * 4 * 128 * 2,
        16384,
    ),
    # https://huggingface.co/CohereForAI/c4ai-command-r-v01/blob/main/config.json
    "command-r": (
        {
            "model_type": "cohere",
            "hidden_size": 8192,
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "num_hidden_layers": 40,
            "max_position_embeddings": 8192,
        },
        2 * 40 * 64 * 128 * 2,
        8192,
    ),
    # https://huggingface.co/allenai/OLMo-7B-hf/blob/main/config.json: num_key_value_heads = 32 (MHA),
    # as transformers' convert_olmo_weights_to_hf.py writes it (checked against a copy of the file)
    "olmo-7b": (
        {
            "model_type": "olmo",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 32,
            "num_hidden_layers": 32,
            "max_position_embeddings": 2048,
        },
        2 * 32 * 32 * 128 * 2,
        2048,
    ),
    # https://huggingface.co/ibm-granite/granite-3.0-8b-instruct/blob/main/config.json
    "granite-3.0-8b": (
        {
            "model_type": "granite",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 40,
            "max_position_embeddings": 4096,
        },
        2 * 40 * 8 * 128 * 2,
        4096,
    ),
    # https://huggingface.co/microsoft/phi-4/blob/main/config.json (model_type phi3, no window)
    "phi-4": (
        {
            "model_type": "phi3",
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_key_value_heads": 10,
            "num_hidden_layers": 40,
            "max_position_embeddings": 16384,
            "sliding_window": None,
        },
        2 * 40 * 10 * 128 * 2,
        16384,
    ),
    # https://huggingface.co/openbmb/MiniCPM4-8B/blob/main/config.json
    "minicpm4-8b": (
        {
            "model_type": "minicpm",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 2,
            "num_hidden_layers": 32,
            "max_position_embeddings": 32768,
        },
        2 * 32 * 2 * 128 * 2,
        32768,
    ),
    # https://huggingface.co/internlm/internlm2_5-7b-chat/blob/main/config.json
    "internlm2.5-7b": (
        {
            "model_type": "internlm2",
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "max_position_embeddings": 32768,
        },
        2 * 32 * 8 * 128 * 2,
        32768,
    ),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_family_bytes_per_token(name):
    config, expected, max_context = FAMILIES[name]
    spec = ModelSpec.from_hf_config(config)
    assert kv_cache_bytes(spec, 1) == expected
    assert spec.max_context == max_context


def test_starcoder2_slides_on_every_layer():
    config = FAMILIES["starcoder2-15b"][0]
    spec = ModelSpec.from_hf_config(config)
    assert [g.kind for g in spec.groups] == ["sliding"]
    # at 16,384 tokens every layer holds only its 4,096-token window
    assert kv_cache_bytes(spec, 16384) == 4096 * 2 * 40 * 4 * 128 * 2


def test_bloom_length_default_is_named():
    notes = " ".join(ModelSpec.from_hf_config(FAMILIES["bloom-176b"][0]).extras["conventions"])
    assert "max_position_embeddings = 2048" in notes and "BloomConfig" in notes
    assert "read from 'n_embed'" in notes


def test_cohere2_pattern_default_three_sliding_one_global():
    config = {
        "model_type": "cohere2",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    }
    spec = ModelSpec.from_hf_config(config)
    assert spec.group("full").layer_indices == tuple(range(3, 32, 4))
    assert "sliding_window_pattern = 4" in " ".join(spec.extras["conventions"])


def test_unknown_family_still_requires_its_length():
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ModelSpec.from_hf_config(
            {"model_type": "something-new", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
        )


def test_mpt_bad_attn_config_is_named():
    with pytest.raises(ValueError, match="attn_config"):
        ModelSpec.from_hf_config({**FAMILIES["mpt-7b"][0], "attn_config": [1]})


def test_cohere2_explicit_null_window_is_kept_not_defaulted():
    config = {
        "model_type": "cohere2",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "max_position_embeddings": 8192,
    }
    assert ModelSpec.from_hf_config(config).group("sliding").window == 4096  # Cohere2Config default
    assert ModelSpec.from_hf_config({**config, "sliding_window": None}).group("sliding") is None
