"""Architecture families' own config conventions, checked against their published config.json files.

Each config below is the cache-relevant part of the file as published on the Hugging Face Hub (the
URL is in the id). Expected bytes per token are computed by hand in the test from the published
numbers and the family's rule in its transformers / vLLM attention code, not from our code:
bf16 K and V = 2 x layers x KV heads x head_dim x 2 bytes.
"""

import copy
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvcache import ModelSpec, catalog, for_engine, kv_cache_bytes
from kvcache.spec import NO_CACHE_FIELDS
from tests.support import paths
from tests.support.examples import examples

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


# -- kvcache never silent --------------------------------------------------------------------------
# Never a silent wrong number: every cache-shaping field of every shipped and test config,
# altered (or added where it is absent), is either refused with a message naming it or changes the
# figure. An unchanged figure is accepted only where the engine says why the field cannot matter.


FIXTURES = paths.FIXTURES / "kvcache"
PREFIXES = ("index_", "indexer_", "mamba_", "ssm_", "linear_")
NAMES = ("layer_types", "attn_type_list", "hybrid_override_pattern", "layers_block_type", "num_kv_shared_layers")
# the fields that shape an attention-only cache: heads, widths, windows, chunks, MLA ranks, patterns
ATTENTION_FIELDS = (
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "use_sliding_window",
    "max_window_layers",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "kv_lora_rank",
    "qk_rope_head_dim",
)
# beyond every window and chunk of the configs (Llama 4's 8192), so a sliding or chunked layer
# turned full (or back) shows
LENGTHS = (1, 4096, 131072)
LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
}
CONFIGS = {m.id: m.config for m in catalog.models().values()}
CONFIGS |= {m["id"]: m["config"] for m in json.loads((FIXTURES / "ground_truth_configs.json").read_text())["models"]}
CONFIGS["llama-8-layers"] = LLAMA
SYNONYMS = {"attention": "full_attention"}  # the same layer kind in two vocabularies
LAYER_VALUES = [
    "full_attention",
    "sliding_attention",
    "linear_attention",
    "mamba",
    "attention",
    "conv",
    "hybrid",
    0,
    1,
    2,
]


def text(config: dict) -> dict:
    """The dict holding the text model's fields (a multimodal wrapper's text_config)."""
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def shaping(key: str) -> bool:
    return key.startswith(PREFIXES) or key in NAMES or key in ATTENTION_FIELDS


def figure(config: dict) -> tuple[int, ...] | str:
    try:
        spec = ModelSpec.from_hf_config(config)
        return tuple(
            kv_cache_bytes(for_engine(spec, e), n, 1, "bf16") for e in ("vllm", "transformers5") for n in LENGTHS
        )
    except ValueError as exc:
        return f"refused: {exc}"


def allowed_unchanged(config: dict, key: str, index: int | None, altered: dict | None = None) -> bool:
    """The engine says why the field cannot matter: a no-cache field, or one it lists as unused in
    the published config or in the altered one (a window set where use_sliding_window is false)."""
    for cfg in (config, altered) if altered is not None else (config,):
        spec = ModelSpec.from_hf_config(cfg)
        if key in NO_CACHE_FIELDS or key in spec.extras["ignored_fields"]:
            return True
        if index is not None and f"{key}[{index}]" in spec.extras["ignored_positions"]:
            return True
    return False


# the family defaults the engine fills in for a field the file leaves out (config classes' values)
ARCH_DEFAULTS = json.loads((paths.REPO / "kvcache/data/arch_defaults.json").read_text())


def family_default(config: dict, key: str) -> object:
    entry = ARCH_DEFAULTS.get(str(text(config).get("model_type")), {})
    return entry.get("defaults", {}).get(key, "no default")


FIELDS = sorted((cid, key) for cid, cfg in CONFIGS.items() for key in text(cfg) if shaping(key))


def test_every_config_is_accepted_unaltered():
    for cid, config in CONFIGS.items():
        assert not isinstance(figure(config), str), cid


def test_the_fields_exist_in_the_configs():
    """The property below really runs over hybrids, MiniMax, Gemma-3n and DeepSeek-V3.2 fields."""
    keys = {k for _, k in FIELDS}
    assert {"attn_type_list", "hybrid_override_pattern", "layer_types", "num_kv_shared_layers"} <= keys
    assert {"index_head_dim", "mamba_d_ssm", "ssm_state_size", "linear_key_head_dim"} <= keys
    # and over the attention-only families': Llama 4's chunks, Command-A's pattern, Kimi-K2's MLA
    assert {"attention_chunk_size", "no_rope_layers", "sliding_window_pattern", "kv_lora_rank"} <= keys
    assert {"llama-4-scout", "command-a", "olmo-3-7b-instruct", "glm-4.5", "kimi-k2-instruct", "minimax-m2"} <= {
        c for c, _ in FIELDS
    }


def mutate(value, data):
    """A different value of the same shape, or None (the field removed)."""
    if isinstance(value, bool) or value is None:
        return data.draw(st.sampled_from([None, 1, "x"]))
    if isinstance(value, int):
        return data.draw(
            st.sampled_from([None, value + 1, value * 2, max(value - 1, 0), 3 * value + 7]).filter(lambda v: v != value)
        )
    if isinstance(value, str) and len(value) > 1:
        i = data.draw(st.integers(0, len(value) - 1))
        c = data.draw(st.sampled_from("M*-EX").filter(lambda c: c != value[i]))
        return value[:i] + c + value[i + 1 :], i
    if isinstance(value, list) and value:
        i = data.draw(st.integers(0, len(value) - 1))
        new = data.draw(
            st.sampled_from(LAYER_VALUES).filter(
                lambda v: SYNONYMS.get(v, v) != SYNONYMS.get(value[i], value[i]) and type(v) is type(value[i])
            )
        )
        return [*value[:i], new, *value[i + 1 :]], i
    return data.draw(st.sampled_from([None, 0, 2]))


def alter_one_field(data) -> str:
    """Alter one drawn field of one config; return what the engine did: "refused", "changed" (the
    figure moved) or "unchanged" (the figure held, for a reason the engine gives)."""
    cid, key = data.draw(st.sampled_from(FIELDS))
    config = copy.deepcopy(CONFIGS[cid])
    before = figure(config)
    drawn = mutate(text(config)[key], data)
    value, index = drawn if isinstance(drawn, tuple) else (drawn, None)
    # an explicit null removed is the same config, or one a family default fills (a change either
    # way is right): nothing to check, so the example does not count
    assume(not (value is None and text(config)[key] is None))
    if value is None:
        del text(config)[key]
    else:
        text(config)[key] = value
    after = figure(config)
    if isinstance(after, str):
        return "refused"
    if after != before:
        return "changed"
    original = text(CONFIGS[cid])[key]
    if allowed_unchanged(CONFIGS[cid], key, index, config):
        return "unchanged"
    if value is None and family_default(CONFIGS[cid], key) == original:
        return "unchanged"  # removed, the family's default (its config class's) is the published value
    if value is None and isinstance(original, int) and not isinstance(original, bool):
        # removed, it takes a default equal to the published value (head_dim = hidden / heads): the
        # field is read, not ignored, when another value of it is refused or changes the figure
        text(config)[key] = 2 * original + 1
        assert figure(config) != before, f"{cid}: {key} is ignored (another value changed nothing)"
        return "unchanged"
    raise AssertionError(f"{cid}: {key} -> {value!r} changed nothing silently")


def test_altering_a_field_is_refused_or_changes_the_figure():
    outcomes: Counter[str] = Counter()

    @settings(max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def alter(data):
        outcome = alter_one_field(data)
        event(outcome)
        outcomes[outcome] += 1

    alter()
    # Not vacuous: the draws reached refusals and changed figures, and most of them did one or the
    # other rather than end on an accepted "cannot matter".
    assert outcomes["refused"] > 0 and outcomes["changed"] > 0, outcomes
    assert outcomes["refused"] + outcomes["changed"] > outcomes["unchanged"], outcomes


ADDED = {
    "num_kv_shared_layers": 2,
    "index_head_dim": 128,
    "index_topk_freq": 4,
    "indexer_types": ["full"],
    "mamba_d_state": 16,
    "mamba_num_heads": 64,
    "ssm_state_size": 128,
    "linear_key_head_dim": 128,
    "linear_attn_config": {"num_heads": 4},
    "attn_type_list": [0, 1] * 4,
    "layers_block_type": ["mamba", "attention"] * 4,
    "hybrid_override_pattern": "M*M*M*M*",
    "layer_types": ["linear_attention"] * 8,
}


@pytest.mark.parametrize(("key", "value"), sorted(ADDED.items()))
def test_adding_a_field_to_plain_attention_is_refused_or_counted(key, value):
    before = figure(LLAMA)
    after = figure({**LLAMA, key: value})
    assert isinstance(after, str) or after != before


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({**LLAMA, "index_topk_freq": 4}, "index_topk_freq"),
        ({**LLAMA, "mamba_d_state": 16}, "mamba_d_state"),
        ({**LLAMA, "linear_attn_config": {"num_heads": 4}}, "linear_attn_config"),
        ({**LLAMA, "attn_type_list": [0, 1] * 4}, "attn_type_list"),
        ({**LLAMA, "layer_types": ["full_attention"] * 7 + ["conv"]}, r"layer_types\[7\]"),
        ({**LLAMA, "layer_types": ["linear_attention"] * 8}, "linear_attention"),
        ({**LLAMA, "layers_block_type": ["attention"] * 7 + ["xlstm"]}, r"layers_block_type\[7\]"),
        ({**LLAMA, "num_kv_shared_layers": 8}, "num_kv_shared_layers"),
        ({**LLAMA, "layer_types": ["full_attention"] * 8, "hybrid_override_pattern": "********"}, "both"),
        ({**CONFIGS["minimax-m1-80k"], "attn_type_list": [0] * 79 + [2]}, r"attn_type_list\[79\]"),
        ({**CONFIGS["falcon-h1-7b"], "attn_layer_indices": [0, 1]}, "attn_layer_indices"),
        ({**CONFIGS["falcon-h1-7b"], "mamba_d_head": 64}, "mamba_d_ssm"),
        ({**CONFIGS["deepseek-v3.2-exp"], "index_topk_freq": 4}, "index_topk_freq"),
        # a window no layer rule of the family reads (Jamba's attention layers come from attn_layer_period)
        ({**CONFIGS["jamba-v0.1"], "sliding_window": 4096}, "sliding_window"),
        ({**CONFIGS["qwen2.5-7b"], "use_sliding_window": 1}, "use_sliding_window"),
        (
            {"model_type": "rwkv", "hidden_size": 4096, "num_hidden_layers": 32, "max_position_embeddings": 8192},
            "pure state-space",
        ),
        # a pure Mamba-2 config missing the head width, and one whose mixer widths disagree
        ({"model_type": "mamba2", "hidden_size": 4096, "num_hidden_layers": 64, "num_heads": 128}, "head_dim"),
        ({**CONFIGS["mamba-codestral-7b"], "head_dim": 32}, "num_heads x head_dim"),
        # Mamba-1 whose intermediate_size is not expand x hidden_size (transformers keeps expand's)
        ({**CONFIGS["mamba-2.8b"], "intermediate_size": 8192}, "intermediate_size"),
        # Falcon-Mamba-7B as published (huggingface.co/tiiuae/falcon-mamba-7b config.json, copied in
        # public benchmark code): expand 16 but intermediate_size 8192 = 2 x hidden_size
        (
            {
                "model_type": "falcon_mamba",
                "conv_kernel": 4,
                "expand": 16,
                "hidden_size": 4096,
                "intermediate_size": 8192,
                "num_hidden_layers": 64,
                "state_size": 16,
                "time_step_rank": 256,
                "vocab_size": 65024,
            },
            "intermediate_size",
        ),
    ],
)
def test_refusals_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        ModelSpec.from_hf_config(config)


@pytest.mark.parametrize("engine_id", ["sglang", "trtllm", "transformers4"])
@pytest.mark.parametrize("model_id", ["jamba-v0.1", "qwen3-next-80b-a3b", "minimax-m1-80k", "deepseek-v3.2-exp"])
def test_engines_without_modelled_state_layouts_refuse(engine_id, model_id):
    with pytest.raises(ValueError, match="not modelled"):
        for_engine(catalog.model_spec(model_id), engine_id)


def test_fields_the_family_does_not_read_are_said_unused():
    """A window is unused when layer_types has no sliding layer, and with use_sliding_window false
    (Qwen2); refused when the family's layer rule never reads one. Cohere2's head_dim is read:
    transformers 5.23 sizes the cache by it even where it is not hidden / heads (measured on a
    small Cohere2 config, head_dim 32 of hidden 256 / 4 heads)."""
    command_a = {**CONFIGS["command-a"], "head_dim": 64}
    assert figure(command_a) != figure(CONFIGS["command-a"])
    m2 = {**CONFIGS["minimax-m2"], "sliding_window": 4096}  # attn_type_list: every layer full
    assert isinstance(figure(m2), str) and "sliding_window" in figure(m2)
    olmo = {**CONFIGS["olmo-3-7b-instruct"], "layer_types": ["full_attention"] * 32}
    assert "sliding_window" in ModelSpec.from_hf_config(olmo).extras["ignored_fields"]
    assert "sliding_window" in ModelSpec.from_hf_config(CONFIGS["qwen2.5-7b"]).extras["ignored_fields"]
