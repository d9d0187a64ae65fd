"""Engine conventions for the cache parts whose bytes are the engine's choice, not the config's:
recurrent-state dtypes and convolution columns, DeepSeek-V3.2's indexer and latent layouts. Each
rule names its source (engines' docstring has the summary). Kept apart from engines so that
ModelSpec.from_hf_config can give a spec with the default engine's (vLLM's) conventions without an
import cycle: this module imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# kinds whose bytes depend on engine rules modelled for vLLM and transformers 5 only
MODELLED_ONLY = ("mamba", "mamba2", "linear_attention", "lightning", "indexer")

_TF5_STATE = (
    "transformers 5: conv state of conv_kernel columns in the model dtype, recurrent state in float32 "
    "(cache_utils.py LinearAttentionLayer; measured, scripts/kv_ground_truth.py)"
)
_TF5_LIGHTNING = "transformers 5: MiniMaxCache keeps the lightning state in the model dtype (modeling_minimax.py)"
_TF5_INDEXER = "transformers 5: StaticIndexedLayer keeps the indexer keys in the model dtype (cache_utils.py)"
# transformers has no fp8 StaticCache: its fp8 cache is QuantizedCache(backend="fp8"), whose
# Fp8QuantizedLayer keeps the K/V as float8_e4m3fn plus one float32 scale (a 0-dim tensor frozen at
# the first update) per K and per V tensor of each layer, whatever the batch and length
# (cache_utils.py Fp8QuantizedLayer._quantize / update; measured, scripts/kv_ground_truth.py), and
# QuantizedCache.__init__ refuses a model whose layer_types are not all full_attention
# {what}: what the layer caches, "K/V" or (an MLA layer) "MLA latent".
_TF5_FP8 = (
    "transformers 5: StaticCache {what} in the model dtype; fp8 = QuantizedCache(backend='fp8'): float8_e4m3fn "
    "{what} + one float32 scale per K and per V tensor of each layer (cache_utils.py Fp8QuantizedLayer)"
)
_TF5_STATIC = (
    "transformers 5: StaticCache {what} in the model dtype; no fp8 cache for this model (QuantizedCache takes "
    "full-attention-only models, cache_utils.py QuantizedCache.__init__)"
)
_VLLM_STATE = (
    "vLLM: conv_kernel - 1 conv columns in mamba_cache_dtype, recurrent state in mamba_ssm_cache_dtype "
    "(mamba_utils.py MambaStateShapeCalculator / MambaStateDtypeCalculator)"
)
_VLLM_NEMOTRON = (
    "vLLM: conv_kernel - 1 conv columns in mamba_cache_dtype; Nemotron-H's recurrent state defaults to "
    "{dtype} (models/config.py NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype)"
)
_VLLM_LIGHTNING = "vLLM: lightning state heads x head_dim x head_dim in mamba_cache_dtype (mamba_utils.py)"
_VLLM_INDEXER = "vLLM: fp8 key + float32 scale per 128 values, whatever the KV dtype (deepseek_v2.py Indexer)"
_VLLM_DS_MLA = (
    "vLLM: an fp8 KV dtype stores DeepSeek-V3.2's latent as fp8_ds_mla "
    "(models/config.py DeepseekV32ForCausalLM.verify_and_update_config)"
)


def _cached(kind: str) -> str:
    return "MLA latent" if kind == "mla" else "K/V"


def apply(groups: tuple[Any, ...], engine_id: str, model_type: str, ssm_cache_dtype: str | None) -> tuple[Any, ...]:
    """Each layer group (a spec LayerGroup) with `engine_id`'s own dtype / layout rules;
    ssm_cache_dtype is the config's mamba_ssm_cache_dtype (vLLM reads it for Nemotron-H)."""
    out = []
    indexed = any(g.kind == "indexer" for g in groups)
    # transformers' QuantizedCache takes the model only when every layer is full attention (MLA is)
    tf5_quantizable = all(g.kind in ("full", "mla") for g in groups)
    for g in groups:
        # start from no convention, so for_engine(for_engine(s, a), b) is for_engine(s, b)
        g = dataclasses.replace(g, conv_dtype="", ssm_dtype="", conv_columns=0, layout="", convention="")
        if engine_id == "transformers5":
            if g.kind in ("mamba", "mamba2", "linear_attention"):
                assert g.state is not None
                g = dataclasses.replace(
                    g, conv_dtype="kv", ssm_dtype="fp32", conv_columns=g.state.conv_kernel, convention=_TF5_STATE
                )
            elif g.kind == "lightning":
                g = dataclasses.replace(g, ssm_dtype="kv", convention=_TF5_LIGHTNING)
            elif g.kind == "indexer":
                g = dataclasses.replace(g, layout="tf5_static", convention=_TF5_INDEXER)
            elif tf5_quantizable:  # full / MLA only: fp8 is QuantizedCache's, with its scales
                g = dataclasses.replace(g, layout="tf5_fp8", convention=_TF5_FP8.format(what=_cached(g.kind)))
            elif g.kind in ("full", "sliding", "chunked", "mla"):
                g = dataclasses.replace(g, layout="tf5_static", convention=_TF5_STATIC.format(what=_cached(g.kind)))
        elif engine_id == "vllm":
            if g.kind in ("mamba", "mamba2", "linear_attention"):
                if model_type == "nemotron_h":
                    default = ssm_cache_dtype or "fp32"
                    g = dataclasses.replace(
                        g, ssm_dtype=f"auto:{default}", convention=_VLLM_NEMOTRON.format(dtype=default)
                    )
                else:
                    g = dataclasses.replace(g, convention=_VLLM_STATE)
            elif g.kind == "lightning":
                g = dataclasses.replace(g, convention=_VLLM_LIGHTNING)
            elif g.kind == "indexer":
                g = dataclasses.replace(g, layout="fp8_scale128", convention=_VLLM_INDEXER)
            elif g.kind == "mla" and indexed:
                g = dataclasses.replace(g, layout="ds_mla", convention=_VLLM_DS_MLA)
        out.append(g)
    return tuple(out)
