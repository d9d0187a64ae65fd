"""vLLM's rules for state hybrids, indexers and KV sharing, with every number worked by hand from
vLLM's own formulas (not from our code):

    state shapes   mamba_utils.py MambaStateShapeCalculator: conv (conv_dim / tp, kernel - 1),
                   recurrent (heads / tp, head_dim, state); lightning (heads / tp, hd, hd)
    state dtypes   MambaStateDtypeCalculator: conv = mamba_cache_dtype, recurrent =
                   mamba_ssm_cache_dtype ("auto" = conv); Nemotron-H "auto" = float32
                   (models/config.py NemotronHForCausalLMConfig)
    block size     models/config.py HybridAttentionMambaModelConfig: attention block =
                   16 x cdiv(state page, 16 x attention bytes per token), state page padded to it
    DeepSeek-V3.2  indexer key 128 fp8 + 4 B scale = 132 B (deepseek_v2.py Indexer), fp8 KV =
                   fp8_ds_mla 656 B (512 fp8 + 4 x 4 B scales + 64 x 2 B RoPE), one uniform-type group
"""

import json
from fractions import Fraction
from pathlib import Path

import pytest

from kvcache import ModelSpec, catalog, for_engine, kv_cache_bytes, plan, vllm_layout

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kvcache"
CONFIGS = {m["id"]: m["config"] for m in json.loads((FIXTURES / "ground_truth_configs.json").read_text())["models"]}


def vllm_spec(model_id: str) -> ModelSpec:
    return for_engine(ModelSpec.from_hf_config(CONFIGS[model_id]), "vllm")


def kinds(lay) -> list[tuple[str, int]]:
    return [(g.kind, len(g.layers)) for g in lay.groups]


def test_jamba_attention_block_grows_to_hold_a_mamba_page():
    spec = vllm_spec("jamba-v0.1")
    state_page = 8192 * 3 * 2 + 8192 * 16 * 2  # conv (d_inner, k - 1) + recurrent (d_inner, 16), bf16
    attn_token = 2 * 8 * 128 * 2
    block = 16 * -(-state_page // (16 * attn_token))
    assert block == 80
    lay = vllm_layout(spec, "bf16")
    assert lay.page_bytes == block * attn_token == 327_680  # state page padded up to it
    assert lay.group_size == 4  # 4 attention layers, 28 Mamba layers: 7 groups of 4
    assert sorted(kinds(lay)) == sorted([("full", 4)] + [("mamba", 4)] * 7)
    assert lay.steady_blocks(4096) == -(-4096 // 80) + 7  # one block per Mamba group
    assert "raised to" in lay.describe() and "padded" in lay.describe()


@pytest.mark.parametrize(
    ("model_id", "state_page", "attn_token", "block", "groups"),
    [
        # conv (2 x 16 x 128 + 32 x 128) x 3 + recurrent 32 x 128 x 128, bf16
        (
            "qwen3-next-80b-a3b",
            (8192 * 3 + 32 * 128 * 128) * 2,
            2 * 2 * 256 * 2,
            544,
            [("full", 12)] + [("linear_attention", 12)] * 3,
        ),
        # Falcon-H1: conv (3072 + 2 x 256) x 3 + recurrent 24 x 128 x 256; attention in every layer too
        ("falcon-h1-7b", (3584 * 3 + 24 * 128 * 256) * 2, 2 * 2 * 128 * 2, 1568, [("full", 44), ("mamba2", 44)]),
        # MiniMax: lightning state 64 x 128 x 128, no conv
        ("minimax-m1-80k", 64 * 128 * 128 * 2, 2 * 8 * 128 * 2, 512, [("full", 10)] + [("lightning", 10)] * 7),
    ],
)
def test_hybrid_block_size_and_groups(model_id, state_page, attn_token, block, groups):
    assert 16 * -(-state_page // (16 * attn_token)) == block
    lay = vllm_layout(vllm_spec(model_id), "bf16")
    assert {g.block_size for g in lay.groups if not g.is_state} == {block}
    assert lay.page_bytes == block * attn_token
    assert sorted(kinds(lay)) == sorted(groups)


def test_nemotron_h_recurrent_state_defaults_to_float32_in_vllm():
    spec = vllm_spec("nemotron-h-8b")
    conv = (128 * 64 + 2 * 8 * 128) * 3 * 2  # bf16
    assert kv_cache_bytes(spec, 0) == 24 * (conv + 128 * 64 * 128 * 4)
    assert kv_cache_bytes(spec, 0, ssm_dtype="bf16") == 24 * (conv + 128 * 64 * 128 * 2)  # explicit wins
    # other families: "auto" = the conv dtype
    qwen = vllm_spec("qwen3-next-80b-a3b")
    assert kv_cache_bytes(qwen, 0) == 36 * (8192 * 3 + 32 * 128 * 128) * 2
    assert kv_cache_bytes(qwen, 0, ssm_dtype="fp32") == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)


def test_deepseek_v32_layouts_in_vllm():
    spec = vllm_spec("deepseek-v3.2-exp")
    assert kv_cache_bytes(spec, 1, kv_dtype="bf16") == 61 * (576 * 2 + 132)
    assert kv_cache_bytes(spec, 1, kv_dtype="fp8") == 61 * (512 + 4 * 4 + 64 * 2 + 132) == 61 * 788
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        kv_cache_bytes(spec, 1, kv_dtype="int8")
    lay = vllm_layout(spec, "bf16")
    assert kinds(lay) == [("mla", 61)]  # MLA and indexer layers: one uniform-type group
    assert lay.block_bytes == 16 * 61 * (1152 + 132)


def test_deepseek_v32_transformers_keeps_the_indexer_in_the_model_dtype():
    spec = for_engine(ModelSpec.from_hf_config(CONFIGS["deepseek-v3.2-exp"]), "transformers5")
    assert kv_cache_bytes(spec, 1) == 61 * (576 + 128) * 2


def test_gemma_3n_shared_layers_get_no_cache_in_vllm():
    lay = vllm_layout(vllm_spec("gemma-3n-e4b"), "bf16")
    # 20 layers keep K/V: 16 sliding + 4 full -> groups of 4 (the 15 shared layers have no spec)
    assert lay.group_size == 4
    assert sorted(kinds(lay)) == sorted([("sliding", 4)] * 4 + [("full", 4)])


def test_plan_uses_the_hybrid_allocator():
    spec = catalog.model_spec("jamba-v0.1")
    p = plan(spec, catalog.gpu("h100-80gb"), weight_dtype_name="int4", kv_dtype="bf16", context_len=4096, batch=1)
    assert p.vllm is not None
    assert p.kv_budget > 0 and p.vllm.num_blocks == p.kv_budget // 327_680 // 4
    assert p.max_concurrency == p.vllm.num_blocks // (-(-4096 // 80) + 7)


def test_hybrid_start_up_figures():
    """What vLLM logs for Jamba: 'GPU KV cache size' = num_blocks // groups x the attention block,
    'Maximum concurrency' = num_blocks / blocks one request needs (one per state group)."""
    spec = catalog.model_spec("jamba-v0.1")
    p = plan(spec, catalog.gpu("h100-80gb"), weight_dtype_name="int4", kv_dtype="bf16", context_len=65536, batch=1)
    vc = p.vllm
    assert vc.kv_cache_tokens == vc.num_blocks // 8 * 80
    assert vc.logged_blocks == -(-65536 // 80) + 7
    assert vc.logged_concurrency == Fraction(vc.num_blocks, -(-65536 // 80) + 7)


@pytest.mark.parametrize(
    ("model_id", "page"),
    [
        # Mamba-1: conv (d_inner 5120, k - 1 = 3) + recurrent (5120, 16), bf16 (mamba_ssm_cache_dtype auto)
        ("mamba-2.8b", 5120 * 3 * 2 + 5120 * 16 * 2),
        # Mamba-2: conv (8192 + 2 x 8 groups x 128, 3) + recurrent (128 heads, 64, 128), bf16
        ("mamba-codestral-7b", (8192 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 2),
    ],
)
def test_a_state_only_model_is_one_group_of_one_block_per_request(model_id, page):
    """No attention: every layer is the same MambaSpec, so one uniform KV-cache group whose page is
    one layer's whole state (kv_cache_utils.py get_kv_cache_config_uniform_type); a request holds
    one block whatever its length, so num_blocks requests fit."""
    spec = vllm_spec(model_id)
    lay = vllm_layout(spec, "bf16")
    assert kinds(lay) == [(spec.groups[0].kind, 64)]
    assert lay.page_bytes == page
    assert kv_cache_bytes(spec, 1) == kv_cache_bytes(spec, 131072) == 64 * page
    p = plan(spec, catalog.gpu("h100-80gb"), weight_dtype_name="bf16", kv_dtype="bf16", context_len=131072, batch=1)
    assert p.vllm is not None
    assert p.vllm.num_blocks == p.kv_budget // (64 * page)
    assert p.vllm.steady_blocks == p.vllm.logged_blocks == 1
