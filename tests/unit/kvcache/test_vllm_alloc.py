"""vLLM's v1 KV-cache allocator, one test per attention kind, written from vLLM's own formulas
(vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py) with the numbers worked by hand:

    page        = block_size x one layer's bytes per token (AttentionSpec.page_size_bytes)
    num_blocks  = available // page // layers_per_group     (get_num_blocks)
    steady      full/MLA cdiv(L, B); sliding cdiv(W - 1, B) + 1
    start-up    full cdiv(L, B); sliding cdiv(min(W - 1 + max_num_batched_tokens, L), B) + 1;
                chunked cdiv(min(C + max_num_batched_tokens, L), B)
    concurrency = num_blocks / sum of the groups' blocks per request

Check values from the issue: 1x H100 80 GiB, utilization 0.9, 2 GiB reserve, bf16 weights and KV.
"""

import dataclasses
import json
from fractions import Fraction

import pytest

from kvcache import ModelSpec, catalog, for_engine, kv_cache_bytes, plan, vllm_layout
from kvcache.vllm_alloc import capacity, layout, pp_stages
from tests.support import paths

GIB = 1 << 30
USABLE = 80 * GIB * 9 // 10


def cdiv(a, b):
    return -(-a // b)


def h100_bf16(model_id, context_len, **kw):
    return plan(
        catalog.model_spec(model_id),
        catalog.gpu("h100-80gb"),
        weight_dtype_name="bf16",
        kv_dtype="bf16",
        context_len=context_len,
        **kw,
    )


def available(params_total):
    return USABLE - 2 * params_total - 2 * GIB


def test_full_attention_llama_8b_matches_todays_rule():
    L = 32768
    p = h100_bf16("llama-3.1-8b", L)
    page = 16 * 2 * 8 * 128 * 2  # block x (K,V) x 8 KV heads x 128 x bf16
    blocks = available(8_030_000_000) // page // 32
    assert p.vllm.num_blocks == blocks
    assert p.vllm.steady_blocks == p.vllm.logged_blocks == L // 16
    assert p.vllm.steady_concurrency == p.vllm.logged_concurrency == Fraction(blocks, 2048)
    # the integer answer is the same as the per-sequence byte rule the page always used
    assert p.max_concurrency == blocks // 2048 == available(8_030_000_000) // (2 * 32 * 8 * 128 * 2 * L)


def test_sliding_mistral_at_32k_steady_and_logged():
    p = h100_bf16("mistral-7b-v0.1", 32768, max_num_batched_tokens=8192)
    page = 16 * 2 * 8 * 128 * 2
    blocks = available(7_240_000_000) // page // 32
    assert p.vllm.num_blocks == blocks == 28935
    steady = cdiv(4096 - 1, 16) + 1  # 257
    logged = cdiv(min(4096 - 1 + 8192, 32768), 16) + 1  # 769
    assert (p.vllm.steady_blocks, p.vllm.logged_blocks) == (steady, logged) == (257, 769)
    assert f"{float(p.vllm.steady_concurrency):.2f}" == "112.59"
    assert f"{float(p.vllm.logged_concurrency):.1f}" == "37.6"
    assert p.max_concurrency == 112


def test_hybrid_gpt_oss_20b_two_groups_at_4096():
    p = h100_bf16("gpt-oss-20b", 4096)
    lay = p.vllm.layout
    # 12 sliding (window 128) + 12 full layers: group_size 12, no padding
    assert [(g.kind, len(g.layers), g.padding) for g in lay.groups] == [("sliding", 12, 0), ("full", 12, 0)]
    page = 16 * 2 * 8 * 64 * 2
    assert p.vllm.num_blocks == available(catalog.models()["gpt-oss-20b"].params_total) // page // 12
    assert p.vllm.steady_blocks == cdiv(127, 16) + 1 + 4096 // 16 == 265
    assert f"{float(p.vllm.steady_concurrency):.2f}" == "320.16"


def test_hybrid_with_padding_gemma_3_27b_at_4096():
    p = h100_bf16("gemma-3-27b", 4096)
    lay = p.vllm.layout
    # 52 sliding + 10 full: group_size = 10 (52 >= 1.5 x 10), 6 sliding groups (the last padded)
    assert lay.group_size == 10 and len(lay.groups) == 7 and lay.padding_layers == 6 * 10 - 52 == 8
    page = 16 * 2 * 16 * 128 * 2
    blocks = available(catalog.models()["gemma-3-27b"].params_total) // page // 10
    assert p.vllm.num_blocks == blocks
    steady = 4096 // 16 + 6 * (cdiv(1024 - 1, 16) + 1)  # 256 + 6 x 65 = 646
    assert p.vllm.steady_blocks == steady == 646
    assert f"{float(p.vllm.steady_concurrency):.2f}" == "24.05"
    # start-up log at 4096 with 8192 batched: every sliding group budgets min(1023 + 8192, 4096)
    assert p.vllm.logged_blocks == 256 + 6 * (cdiv(4096, 16) + 1)


def test_group_layers_are_strided_like_vllm():
    lay = layout(catalog.model_spec("gemma-3-27b"), "bf16")
    sliding = [i for i in range(62) if (i + 1) % 6]
    assert lay.groups[0].layers == tuple(sliding[0::6]) and lay.groups[5].layers == tuple(sliding[5::6])
    assert lay.groups[6].layers == tuple(range(5, 62, 6))


def test_group_size_uses_the_larger_count_below_one_and_a_half():
    # 12 sliding + 13 full (gpt-oss + an EAGLE layer in vLLM's comment): pad to 13 + 13
    config = {
        "model_type": "x",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "num_hidden_layers": 25,
        "max_position_embeddings": 4096,
        "sliding_window": 128,
        "layer_types": ["sliding_attention"] * 12 + ["full_attention"] * 13,
    }
    lay = layout(ModelSpec.from_hf_config(config), "bf16")
    assert lay.group_size == 13 and [g.padding for g in lay.groups] == [1, 0]


def test_mla_deepseek_v3_one_latent_per_layer():
    spec = catalog.model_spec("deepseek-v3")
    lay = layout(spec, "bf16", tp=8)
    assert lay.page_bytes == 16 * 576 * 2 and lay.group_size == 61  # latent replicated on every GPU
    c = capacity(lay, 40 * GIB, 65536)
    assert c.num_blocks == 40 * GIB // (16 * 576 * 2) // 61
    assert c.steady_blocks == c.logged_blocks == 65536 // 16


LLAMA4_LIKE = {
    "model_type": "llama4_text",
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "max_position_embeddings": 262144,
    "attention_chunk_size": 8192,
}


def test_chunked_llama4_groups_and_blocks():
    spec = ModelSpec.from_hf_config(LLAMA4_LIKE)  # no no_rope_layers: every 4th layer is global
    assert spec.group("full").layer_indices == tuple(range(3, 48, 4))
    lay = layout(spec, "bf16")
    assert lay.group_size == 12 and [g.kind for g in lay.groups] == ["chunked"] * 3 + ["full"]
    c = capacity(lay, 50 * GIB, 131072, max_num_batched_tokens=8192)
    # a chunk of 8192 tokens starts on a block boundary: it touches 8192 / 16 blocks
    assert c.steady_blocks == 3 * 512 + 131072 // 16
    assert c.logged_blocks == 3 * cdiv(min(8192 + 8192, 131072), 16) + 131072 // 16


def test_chunked_no_rope_layers_list():
    flags = [1, 1, 1, 0] * 12
    spec = ModelSpec.from_hf_config({**LLAMA4_LIKE, "no_rope_layers": flags})
    assert spec.group("chunked").layers == 36 and spec.group("chunked").window == 8192
    with pytest.raises(ValueError, match="no_rope_layers"):
        ModelSpec.from_hf_config({**LLAMA4_LIKE, "no_rope_layers": [1, 2]})


def test_pipeline_stages_follow_get_pp_indices():
    # 62 layers over 4 stages: 15 each, the 2 extra go to the stages before the last
    assert [len(s) for s in pp_stages(62, 4)] == [15, 16, 16, 15]
    assert [len(s) for s in pp_stages(80, 2)] == [40, 40]


def test_pipeline_parallel_num_blocks_is_the_fullest_stage():
    lay = layout(catalog.model_spec("llama-3.1-70b"), "bf16")
    page = 16 * 2 * 8 * 128 * 2
    c = capacity(lay, 30 * GIB, 8192, pp=2)
    assert c.num_blocks == 30 * GIB // page // 40  # each stage holds 40 of the 80 layers


def test_plan_with_pipeline_parallel_splits_weights():
    spec = catalog.model_spec("llama-3.1-70b")
    p = plan(spec, catalog.gpu("h100-80gb"), gpu_count=4, tp=2, pp=2, weight_dtype_name="fp8", context_len=8192)
    assert p.replicas == 1 and p.weights_per_gpu == cdiv(70_600_000_000, 4)


def test_cpu_offload_moves_weights_off_the_gpu():
    spec = catalog.model_spec("llama-3.1-8b")
    base = plan(spec, catalog.gpu("l4-24gb"), context_len=8192)
    off = plan(spec, catalog.gpu("l4-24gb"), context_len=8192, cpu_offload_bytes=4 * GIB)
    assert off.weights_per_gpu == base.weights_per_gpu - 4 * GIB and off.kv_budget == base.kv_budget + 4 * GIB


def test_other_engines_use_their_own_allocators():
    spec = catalog.model_spec("mistral-7b-v0.1")
    kw = {"weight_dtype_name": "bf16", "kv_dtype": "bf16", "context_len": 32768}
    sg = plan(spec, catalog.gpu("h100-80gb"), engine_id="sglang", **kw)
    assert sg.vllm is None and sg.sequence_bytes == 4096 * 2 * 32 * 8 * 128 * 2  # exact window tokens
    trt = plan(spec, catalog.gpu("h100-80gb"), engine_id="trtllm", **kw)
    assert trt.sequence_bytes == 256 * 16 * 2 * 32 * 8 * 128 * 2  # whole blocks of the window


def test_state_hybrids_of_sliding_attention_are_not_forced_into_the_vllm_model():
    # Jamba used to be refused here; state hybrids with full attention are now modelled
    # (tests/unit/kvcache/test_vllm_alloc.py). Sliding + state layers are still not.
    spec = catalog.model_spec("jamba-v0.1")
    sliding = dataclasses.replace(spec.group("full"), kind="sliding", window=4096)
    hybrid = dataclasses.replace(spec, groups=(sliding, spec.group("mamba")))
    assert layout(hybrid, "bf16") is None


def test_draft_with_a_smaller_head_gets_its_own_group_with_a_bigger_block():
    from kvcache.engines import with_draft

    spec = with_draft(catalog.model_spec("llama-3.1-70b"), catalog.model_spec("llama-3.2-1b"))
    lay = layout(spec, "bf16")
    # target page 16 x 2 x 8 x 128 x 2 = 65,536 B; draft 16 x 2 x 8 x 64 x 2 = 32,768 B, so vLLM
    # doubles the draft's block to 32 tokens. 80 + 16 layers: group_size 16, 5 target groups + 1
    assert lay.page_bytes == 65536 and lay.group_size == 16
    assert [(g.kind, g.block_size, len(g.layers)) for g in lay.groups] == [("full", 16, 16)] * 5 + [("full", 32, 16)]
    c = capacity(lay, 20 * GIB, 8192)
    assert c.num_blocks == 20 * GIB // 65536 // 16
    assert c.steady_blocks == 5 * (8192 // 16) + 8192 // 32


def test_draft_with_the_same_head_shape_joins_the_target_group():
    from kvcache.engines import with_draft

    spec = with_draft(catalog.model_spec("llama-3.1-70b"), catalog.model_spec("llama-3.1-8b"))
    lay = layout(spec, "bf16")
    assert len(lay.groups) == 1 and lay.group_size == 80 + 32
    p = plan(spec, catalog.gpu("h200-141gb"), gpu_count=2, tp=2, weight_dtype_name="fp8", context_len=8192)
    assert p.weights_total == 70_600_000_000 + 8_030_000_000


@pytest.mark.parametrize(("chunk", "block", "touched"), [(8192, 16, 512), (10, 4, 3), (9, 4, 3), (6, 4, 2), (6, 8, 2)])
def test_chunk_touches_blocks_by_its_worst_offset(chunk, block, touched):
    # by hand: C=6, B=8: chunk [6, 11] spans blocks 0 and 1, two blocks for a 6-token chunk;
    # C=6, B=4: chunks [0,5], [6,11], [12,17], [18,23] span blocks 0-1, 1-2, 3-4, 4-5: two each
    from kvcache.vllm_alloc import CacheGroup

    g = CacheGroup("chunked", chunk, block, (0,), 0)
    brute = max((s + chunk - 1) // block - s // block + 1 for s in range(0, chunk * block * 4, chunk))
    assert g.steady_blocks(10**9) == brute == touched


def test_mla_capacity_is_the_same_integer_as_the_byte_rule():
    """For MLA (like full attention) vLLM's num_blocks // blocks per request equals the budget
    divided by one request's whole-block bytes: floor(floor(a / x) / n) = floor(a / (x n))."""
    spec = catalog.model_spec("deepseek-v3")
    for L in (4096, 65536, 100_000):
        p = plan(spec, catalog.gpu("h200-141gb"), gpu_count=8, tp=8, weight_dtype_name="fp8", context_len=L)
        per_request = cdiv(L, 16) * 16 * 61 * 576 * 2  # bf16 latent, replicated on every GPU
        assert p.max_concurrency == p.kv_budget // per_request


def test_gpu_kv_cache_size_log_line():
    # _report_kv_cache_config: num_blocks // number of groups x block_size
    assert h100_bf16("mistral-7b-v0.1", 32768).vllm.kv_cache_tokens == 28935 // 1 * 16 == 462_960
    gemma = h100_bf16("gemma-3-27b", 4096).vllm
    assert gemma.kv_cache_tokens == gemma.num_blocks // 7 * 16


def test_start_up_check_uses_the_logged_budget():
    # vLLM refuses to start when one max-length request's start-up budget exceeds the memory:
    # group_size x page x sum of the groups' start-up blocks
    lay = layout(catalog.model_spec("mistral-7b-v0.1"), "bf16")
    page = 16 * 2 * 8 * 128 * 2
    needed = 32 * page * (cdiv(min(4095 + 8192, 32768), 16) + 1)
    assert capacity(lay, needed, 32768).startup_ok
    assert not capacity(lay, needed - 1, 32768).startup_ok


# -- kvcache vllm hybrid ---------------------------------------------------------------------------
# vLLM's rules for state hybrids, indexers and KV sharing, with every number worked by hand from
# vLLM's own formulas (not from our code):
#
#     state shapes   mamba_utils.py MambaStateShapeCalculator: conv (conv_dim / tp, kernel - 1),
#                    recurrent (heads / tp, head_dim, state); lightning (heads / tp, hd, hd)
#     state dtypes   MambaStateDtypeCalculator: conv = mamba_cache_dtype, recurrent =
#                    mamba_ssm_cache_dtype ("auto" = conv); Nemotron-H "auto" = float32
#                    (models/config.py NemotronHForCausalLMConfig)
#     block size     models/config.py HybridAttentionMambaModelConfig: attention block =
#                    16 x cdiv(state page, 16 x attention bytes per token), state page padded to it
#     DeepSeek-V3.2  indexer key 128 fp8 + 4 B scale = 132 B (deepseek_v2.py Indexer), fp8 KV =
#                    fp8_ds_mla 656 B (512 fp8 + 4 x 4 B scales + 64 x 2 B RoPE), one uniform-type group


FIXTURES = paths.FIXTURES / "kvcache"
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
