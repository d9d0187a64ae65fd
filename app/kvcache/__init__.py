"""KV-cache engine: exact cache bytes for every attention type, paged allocation, prefix sharing,
vLLM's v1 allocator (vllm_alloc), per-engine cache layouts (engines), capacity planning and the
shipped model / GPU catalogs. Imports no streamlit.

    from app.kvcache import ModelSpec, kv_cache_bytes
    spec = ModelSpec.from_hf_config(json.load(open("config.json")))
    kv_cache_bytes(spec, seq_len=131072, batch=1, kv_dtype="bf16")  # -> int, exact bytes
"""

from app.kvcache.capacity import CapacityPlan, parse_decimal, parse_utilization, plan
from app.kvcache.catalog import Gpu, gpu, gpus, model_spec, models
from app.kvcache.dtypes import KV_DTYPES, WEIGHT_DTYPES, kv_dtype, weight_dtype
from app.kvcache.engines import ENGINES, Engine, for_engine, with_draft
from app.kvcache.formulas import (
    GroupBytes,
    KvBreakdown,
    SequenceCost,
    breakdown,
    check_tp,
    kv_cache_bytes,
    kv_heads_per_gpu,
    naive_bytes,
    sequence_cost,
)
from app.kvcache.paged import PagedAllocation, paged_allocation
from app.kvcache.prefix import PrefixSharing, prefix_sharing
from app.kvcache.spec import LayerGroup, ModelSpec, StateDims
from app.kvcache.vllm_alloc import VllmCapacity, VllmLayout
from app.kvcache.vllm_alloc import capacity as vllm_capacity
from app.kvcache.vllm_alloc import layout as vllm_layout

__all__ = [
    "ENGINES",
    "KV_DTYPES",
    "WEIGHT_DTYPES",
    "CapacityPlan",
    "Engine",
    "Gpu",
    "GroupBytes",
    "KvBreakdown",
    "LayerGroup",
    "ModelSpec",
    "PagedAllocation",
    "PrefixSharing",
    "SequenceCost",
    "StateDims",
    "VllmCapacity",
    "VllmLayout",
    "breakdown",
    "check_tp",
    "for_engine",
    "gpu",
    "gpus",
    "kv_cache_bytes",
    "kv_dtype",
    "kv_heads_per_gpu",
    "model_spec",
    "models",
    "naive_bytes",
    "paged_allocation",
    "parse_decimal",
    "parse_utilization",
    "plan",
    "prefix_sharing",
    "sequence_cost",
    "vllm_capacity",
    "vllm_layout",
    "weight_dtype",
    "with_draft",
]
