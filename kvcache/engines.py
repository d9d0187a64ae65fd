"""Serving engines: which MLA layout each stores, its conventions for every other cache part, and
which allocator model its capacity uses.

* MLA layout. vLLM, SGLang, TensorRT-LLM and transformers >= 5 cache DeepSeek's compressed latent
  (kv_lora_rank + qk_rope_head_dim values per token per layer, one 'head'); transformers 4.x
  decompresses it and caches K (qk_nope + qk_rope values) and V (v_head_dim values) per attention
  head, 71x more for DeepSeek-V3.
* Allocator. vLLM: its v1 KV-cache manager, modelled exactly in ``vllm_alloc`` (KV-cache groups,
  padding layers, the extra sliding-window block). TensorRT-LLM: whole blocks of block_size tokens
  per layer group. SGLang (page size 1 by default) and transformers: exactly the tokens held.
* State and indexer conventions (``for_engine``), each rule with its source:

  - transformers 5 (cache_utils.py ``LinearAttentionLayer.lazy_initialization``): the convolution
    state keeps ``conv_kernel`` columns (not kernel - 1) in the model dtype; the Mamba-1, Mamba-2
    and gated-DeltaNet mixers hand the cache a float32 recurrent state (measured on the meta device
    for Jamba, Falcon-H1, Nemotron-H and Qwen3-Next: scripts/kv_ground_truth.py); MiniMax's own
    ``MiniMaxCache`` keeps the lightning state in the model dtype; ``StaticIndexedLayer`` keeps the
    DeepSeek-V3.2 indexer keys in the model dtype. The model dtype is the ``kv_dtype`` argument.
    An fp8 ``kv_dtype`` is what ``QuantizedCache(backend="fp8")`` keeps (cache_utils.py
    ``Fp8QuantizedLayer``; transformers has no fp8 ``StaticCache``): float8_e4m3fn K/V plus one
    float32 scale per K and per V tensor of each layer, 8 B per layer kept once for the whole
    batch (a breakdown ``cache_parts`` entry, in the total; layout "tf5_fp8"). That cache refuses
    every model that is not full attention only (``QuantizedCache.__init__``), and so does the
    engine for those (layout "tf5_static": bf16 / fp16 / fp32 only); the quanto / hqq int caches
    are not modelled and refused.
  - vLLM (vllm/model_executor/layers/mamba/mamba_utils.py ``MambaStateShapeCalculator`` and
    ``MambaStateDtypeCalculator``): kernel - 1 convolution columns in ``mamba_cache_dtype``
    (``state_dtype``), the recurrent state in ``mamba_ssm_cache_dtype`` (``ssm_dtype``, "auto" =
    the conv dtype), except Nemotron-H, whose ``NemotronHForCausalLMConfig`` (models/config.py)
    makes "auto" the config's ``mamba_ssm_cache_dtype`` or float32. DeepSeek-V3.2: the indexer
    key is fp8 + a float32 scale per 128 values (models/deepseek_v2.py ``Indexer``, uint8
    ``MLAAttentionSpec`` of head_size + head_size // 128 x 4), and an fp8 KV dtype selects the
    ``fp8_ds_mla`` latent (models/config.py ``DeepseekV32ForCausalLM.verify_and_update_config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvcache.conventions import MODELLED_ONLY, apply
from kvcache.spec import LayerGroup, ModelSpec


@dataclass(frozen=True)
class Engine:
    id: str
    name: str
    mla_layout: str  # "latent" | "decompressed"
    allocator: str  # "vllm" | "blocks" | "tokens"
    mla_note: str  # what it stores for MLA layers
    alloc_note: str  # how it allocates the cache

    @property
    def note(self) -> str:
        """How it allocates, and what it stores for MLA layers (which only MLA models have)."""
        return f"{self.alloc_note}; MLA layers: {self.mla_note}"

    def convention(self, kind: str) -> str:
        """The engine's rule for a layer group of ``kind`` (a ``LayerGroup.kind``), for a part
        whose bytes carry no more specific convention: what it stores for that kind of layer, and
        how it allocates. A plain attention layer is K and V whatever the engine's MLA layout."""
        stored = {
            "mla": self.mla_note,
            "mla_kv": "MLA decompressed to K/V per head",
            "indexer": "indexer keys per token",
        }.get(kind)
        if stored is None:
            stored = STATE_STORED if kind in STATE_KINDS else "K and V per KV head"
        return f"{self.name}: {stored}; {self.alloc_note}"


#: Layer kinds whose cache is a fixed-size state per sequence, not per token.
STATE_KINDS = frozenset({"mamba", "mamba2", "linear_attention", "lightning"})
STATE_STORED = "recurrent and convolution state per sequence (fixed size, not per token)"

ENGINES: dict[str, Engine] = {
    e.id: e
    for e in (
        Engine("vllm", "vLLM (v1)", "latent", "vllm", "MLA latent", "vLLM v1 block allocator (groups, padding)"),
        Engine(
            "sglang", "SGLang", "latent", "tokens", "MLA latent", "token pool (page size 1): exactly the tokens held"
        ),
        Engine(
            "trtllm",
            "TensorRT-LLM",
            "latent",
            "blocks",
            "MLA latent",
            "paged blocks of block-size tokens per layer group",
        ),
        Engine(
            "transformers5", "transformers >= 5", "latent", "tokens", "MLA latent", "cache holds exactly the tokens"
        ),
        Engine(
            "transformers4",
            "transformers 4.x",
            "decompressed",
            "tokens",
            "MLA decompressed to K/V per head",
            "cache holds exactly the tokens",
        ),
    )
}
DEFAULT_ENGINE = "vllm"


def engine(engine_id: str) -> Engine:
    try:
        return ENGINES[engine_id]
    except KeyError:
        raise ValueError(f"unknown engine {engine_id!r}; supported: {', '.join(ENGINES)}") from None


def _decompressed(g: LayerGroup) -> LayerGroup:
    return LayerGroup(
        "mla_kv",
        g.layer_indices,
        kv_heads=g.mla_heads,
        head_dim=g.qk_nope_head_dim + g.qk_rope_head_dim,
        v_head_dim=g.v_head_dim or g.qk_nope_head_dim + g.qk_rope_head_dim,
    )


def for_engine(spec: ModelSpec, engine_id: str) -> ModelSpec:
    """The model's cache as `engine_id` lays it out: its MLA layout and its conventions for
    recurrent states and indexer keys (dtypes, convolution columns, byte layouts)."""
    e = engine(engine_id)
    if engine_id not in ("vllm", "transformers5"):
        # never a silent wrong number: their state / indexer layouts are not modelled here
        kinds = sorted({g.kind for g in spec.groups if g.kind in MODELLED_ONLY})
        if kinds:
            raise ValueError(
                f"{e.name}'s layout for {', '.join(kinds)} layers is not modelled; choose vLLM or transformers >= 5"
            )
    groups = apply(spec.groups, engine_id, spec.model_type, spec.extras.get("mamba_ssm_cache_dtype"))
    if groups != spec.groups:  # an attention-only model is the same object for every engine
        spec = dataclasses.replace(spec, groups=groups)
    if e.mla_layout == "latent" or not spec.group("mla"):
        return spec
    g = spec.group("mla")
    assert g is not None
    if not (g.mla_heads and g.qk_nope_head_dim and g.v_head_dim):
        raise ValueError(
            "config.json: the decompressed MLA layout needs 'qk_nope_head_dim' and 'v_head_dim'. "
            "Fix: add them or choose an engine that stores the latent"
        )
    groups = tuple(_decompressed(x) if x.kind == "mla" else x for x in spec.groups)
    return dataclasses.replace(spec, groups=groups)


def with_draft(spec: ModelSpec, draft: ModelSpec) -> ModelSpec:
    """The target model plus a speculative-decoding draft model: the draft's weights are resident
    too and its layers keep their own KV cache for every sequence (vLLM adds them to the KV-cache
    groups; layers with the target's head shape share its groups). The draft runs at the same
    tensor parallel size and KV dtype."""
    offset = spec.num_layers
    extra = tuple(
        dataclasses.replace(g, layer_indices=tuple(i + offset for i in g.layer_indices), owner=f"draft {draft.name}")
        for g in draft.groups
    )
    return dataclasses.replace(
        spec,
        groups=spec.groups + extra,
        num_layers=spec.num_layers + draft.num_layers,
        params_total=spec.params_total + draft.params_total,
        params_active=spec.params_active + draft.params_active,
        max_context=min(spec.max_context, draft.max_context),
        params_note=f"{spec.params_note}; + draft {draft.name} {draft.params_total:,}",
    )


def with_ssm_dtype(spec: ModelSpec, ssm_dtype: str | None) -> ModelSpec:
    """`spec` with the recurrent state of every state group kept in `ssm_dtype` (what a user sets
    as vLLM's mamba_ssm_cache_dtype); None ("auto") leaves the engine's convention."""
    if ssm_dtype is None or not any(g.state is not None for g in spec.groups):
        return spec
    groups = tuple(
        dataclasses.replace(g, ssm_dtype=ssm_dtype, convention=f"{g.convention}; recurrent state set to {ssm_dtype}")
        if g.state is not None
        else g
        for g in spec.groups
    )
    return dataclasses.replace(spec, groups=groups)
