"""Property tests over every catalog model: monotonic in length, linear in batch, paged >= exact."""

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvcache import catalog, kv_cache_bytes, paged_allocation, prefix_sharing, sequence_cost
from kvcache.dtypes import KV_DTYPES
from tests.support.examples import examples

MODELS = st.sampled_from(sorted(catalog.models()))
DTYPES = st.sampled_from(sorted(KV_DTYPES))
LENGTHS = st.integers(min_value=0, max_value=300_000)


def kept_in(spec, dtype: str) -> bool:
    """The default engine can keep this model's cache in `dtype` (vLLM keeps DeepSeek-V3.2 in bf16
    or fp8_ds_mla only, and says so rather than giving a number)."""
    try:
        kv_cache_bytes(spec, 1, 1, dtype)
    except ValueError:
        return False
    return True


@settings(max_examples=examples(200), deadline=None)
@given(MODELS, DTYPES, LENGTHS, st.integers(min_value=0, max_value=5000))
def test_monotonic_in_seq_len(model_id, dtype, n, extra):
    spec = catalog.model_spec(model_id)
    assume(kept_in(spec, dtype))
    assert kv_cache_bytes(spec, n, 1, dtype) <= kv_cache_bytes(spec, n + extra, 1, dtype)


@settings(max_examples=examples(200), deadline=None)
@given(MODELS, DTYPES, LENGTHS, st.integers(min_value=0, max_value=512))
def test_linear_in_batch(model_id, dtype, n, batch):
    spec = catalog.model_spec(model_id)
    assume(kept_in(spec, dtype))
    assert kv_cache_bytes(spec, n, batch, dtype) == batch * kv_cache_bytes(spec, n, 1, dtype)


@settings(max_examples=examples(200), deadline=None)
@given(
    MODELS,
    DTYPES,
    st.integers(min_value=1, max_value=2048),
    st.sampled_from([1, 8, 16, 32, 128]),
    st.integers(min_value=1, max_value=8),
)
def test_paged_at_least_exact_and_less_than_one_block_more(model_id, dtype, n, block, batch):
    spec = catalog.model_spec(model_id)
    assume(kept_in(spec, dtype))
    p = paged_allocation(spec, n, batch, dtype, block_size=block)
    assert p.used == kv_cache_bytes(spec, n, batch, dtype)
    assert p.used <= p.allocated
    # at most one partly filled block per attention group per sequence
    cost = sequence_cost(spec, dtype)
    slack = batch * sum(per_token * (block - 1) for per_token, _ in cost.token_groups)
    assert p.allocated - p.used <= slack


@settings(max_examples=examples(200), deadline=None)
@given(
    MODELS,
    st.integers(min_value=1, max_value=16),
    st.integers(min_value=0, max_value=4000),
    st.integers(min_value=0, max_value=4000),
    st.sampled_from([None, 16]),
)
def test_prefix_sharing_saves_memory_never_costs_it(model_id, n, prefix, suffix, block):
    spec = catalog.model_spec(model_id)
    r = prefix_sharing(spec, n, prefix, prefix + suffix, block_size=block)
    assert 0 <= r.saved <= r.without_sharing
    if n == 1:
        assert r.saved == 0


@settings(max_examples=examples(100), deadline=None)
@given(MODELS, DTYPES, LENGTHS, st.sampled_from([1, 2, 4, 8]))
def test_tp_never_increases_per_gpu_memory_beyond_replication(model_id, dtype, n, tp):
    spec = catalog.model_spec(model_id)
    try:
        per_gpu = kv_cache_bytes(spec, n, 1, dtype, tp=tp)
    except ValueError:
        return  # this TP size cannot split the model; covered by the error tests
    whole = kv_cache_bytes(spec, n, 1, dtype)
    assert per_gpu <= whole <= per_gpu * tp


ATTENTION_ONLY = st.sampled_from(
    sorted(k for k in catalog.models() if all(g.is_attention for g in catalog.model_spec(k).groups))
)


@settings(max_examples=examples(200), deadline=None)
@given(
    ATTENTION_ONLY,
    st.integers(min_value=1, max_value=300_000),
    st.sampled_from([1, 16, 32, 128]),
    st.integers(min_value=1, max_value=65536),
)
def test_vllm_blocks_hold_every_token_and_the_log_never_budgets_less(model_id, n, block, batched):
    from kvcache.vllm_alloc import layout

    spec = catalog.model_spec(model_id)
    lay = layout(spec, "bf16", block_size=block)
    for g in lay.groups:
        held = n if g.span is None else min(n, g.span)
        # the blocks a request holds cover the tokens it needs, and the start-up log's budget
        # (window - 1 + a prefill of max_num_batched_tokens) is never below the steady state
        assert g.steady_blocks(n) * g.block_size >= held
        assert g.steady_blocks(n) <= g.logged_blocks(n, batched)
    # every layer that keeps a cache is in exactly one group (Gemma-3n's KV-shared layers keep none)
    assert sorted(i for g in lay.groups for i in g.layers) == sorted({i for g in spec.groups for i in g.layer_indices})
