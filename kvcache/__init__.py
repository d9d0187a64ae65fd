"""KV-cache engine: exact cache bytes for every attention type, paged allocation, prefix sharing,
vLLM's v1 allocator (vllm_alloc), per-engine cache layouts (engines), capacity planning and the
shipped model / GPU catalogs. A product of its own: it imports only the standard library (no part
of the gateway, no third-party package), so any Python 3.11 can use it from a checkout.

    from kvcache import ModelSpec, kv_cache_bytes
    spec = ModelSpec.from_hf_config(json.load(open("config.json")))
    kv_cache_bytes(spec, seq_len=131072, batch=1, kv_dtype="bf16")  # -> int, exact bytes
"""

from kvcache.capacity import CapacityPlan, parse_decimal, parse_utilization, plan
from kvcache.catalog import Gpu, gpu, gpus, model_spec, models
from kvcache.dtypes import KV_DTYPES, WEIGHT_DTYPES, kv_dtype, weight_dtype
from kvcache.engines import ENGINES, Engine, for_engine, with_draft
from kvcache.formulas import (
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
from kvcache.paged import PagedAllocation, paged_allocation
from kvcache.prefix import PrefixSharing, prefix_sharing
from kvcache.spec import LayerGroup, ModelSpec, StateDims
from kvcache.vllm_alloc import VllmCapacity, VllmLayout
from kvcache.vllm_alloc import capacity as vllm_capacity
from kvcache.vllm_alloc import layout as vllm_layout

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
